"""The README's picture of a report's first screen: report.md rendered to HTML (python-markdown,
GitHub-like CSS, plots linked as in the report folder), screenshotted by headless Chromium.

    python scripts/report_screenshot.py reports/examples/demo reports/examples/demo/first-screen.png

Needs `chromium` on PATH (Debian: apt-get install chromium). Not part of diag itself.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import markdown

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, "DejaVu Sans", sans-serif; font-size: 14px;
       line-height: 1.45; color: #1f2328; max-width: 1060px; margin: 16px auto; padding: 0 24px; }
h1 { font-size: 24px; border-bottom: 1px solid #d0d7de; padding-bottom: 6px; margin: 8px 0 10px; }
h2 { font-size: 19px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; margin: 18px 0 8px; }
ul { padding-left: 22px; margin: 6px 0; } li { margin: 4px 0; }
code { font-family: "DejaVu Sans Mono", monospace; font-size: 12.5px; background: #eff1f3; padding: 1px 4px;
       border-radius: 4px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 4px 10px; } th { background: #f6f8fa; }
tr:nth-child(2n) td { background: #f6f8fa; }
img { max-width: 100%; }
"""


def render_html(report_dir: Path) -> str:
    body = markdown.markdown((report_dir / "report.md").read_text(), extensions=["tables"])
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{CSS}</style></head><body>{body}</body></html>"


def main(report_dir: str, png: str, width: int = 1100, height: int = 820) -> int:
    folder = Path(report_dir).resolve()
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=folder, delete=False) as fh:
        fh.write(render_html(folder))
    try:
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--hide-scrollbars", f"--window-size={width},{height}",
                        f"--screenshot={Path(png).resolve()}", f"file://{fh.name}"],
                       check=True, capture_output=True, timeout=120)
    finally:
        Path(fh.name).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
