"""Data loss, round two (issue 35.1): every command that writes refuses to replace files it
cannot prove it wrote. Each entry reproduces a loss the held-out checks found:

- `diag run --out DIR` where DIR is a report copied with `cp -r src/* DIR/` (no hidden
  manifest) plus a PNG the user added under DIR/plots/: the PNG used to be deleted;
- `diag kimi-shaped OUT` over a config.json and a model.safetensors the user had in OUT;
- `diag compare A B --out F` and `diag bench render --out F` over a user's file.
"""

import json
import os
import shutil

import pytest

from bad_catalogue import Bad, Error, Handled


def _report_copied_without_manifest(ctx, *, user_png: bool):
    """A finished report, copied as `cp -r src/* copy/` copies it (dot files stay behind)."""
    from diag.cli.main import main
    assert main(ctx.run()) == 0
    copy = ctx.tmp / "copy"
    copy.mkdir()
    for entry in ctx.out.iterdir():
        if not entry.name.startswith("."):
            (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, copy / entry.name)
    shutil.rmtree(ctx.out)
    if user_png:
        (copy / "plots").mkdir(exist_ok=True)
        (copy / "plots" / "mine.png").write_bytes(b"\x89PNG user's own plot")
    argv = ctx.run()
    argv[argv.index("--out") + 1] = str(copy)
    return argv


def _user_png_kept(ctx):
    assert (ctx.tmp / "copy" / "plots" / "mine.png").read_bytes() == b"\x89PNG user's own plot"


def _copy_replaced(ctx):
    assert json.loads((ctx.tmp / "copy" / "report.json").read_text())["kind"] == "diag-report"
    assert (ctx.tmp / "copy" / ".diag-report.json").is_file()


def _kimi_over_user_checkpoint(ctx):
    out = ctx.tmp / "kimi"
    (out / "target").mkdir(parents=True)
    (out / "config.json").write_text('{"mine": true}')
    (out / "target" / "model.safetensors").write_bytes(b"user weights")
    return ["kimi-shaped", str(out), "--small", "--layers", "2", "--no-drafter"]


def _kimi_files_kept(ctx):
    assert (ctx.tmp / "kimi" / "config.json").read_text() == '{"mine": true}'
    assert (ctx.tmp / "kimi" / "target" / "model.safetensors").read_bytes() == b"user weights"


def _kimi_twice(ctx):
    from diag.cli.main import main
    argv = ["kimi-shaped", str(ctx.tmp / "kimi"), "--small", "--layers", "2", "--no-drafter"]
    assert main(argv) == 0
    return argv


def _kimi_replaced(ctx):
    files = sorted(p.name for p in (ctx.tmp / "kimi" / "target").iterdir())
    assert "config.json" in files and not list(ctx.tmp.glob(".kimi.partial-*"))


def _compare_over_notes(ctx):
    from diag.cli.main import main
    argv = ctx.run()
    argv[argv.index("--out") + 1] = str(ctx.tmp / "rep")
    assert main(argv) == 0
    ctx.write("notes.md", "my notes")
    return ["compare", str(ctx.tmp / "rep"), str(ctx.tmp / "rep"), "--out", str(ctx.tmp / "notes.md")]


def _bench_render_over_notes(ctx):
    ctx.write("summary.md", "my summary")
    return ["bench", "render", "--out", str(ctx.tmp / "summary.md")]


def _bench_workdir_with_files(ctx):
    (ctx.tmp / "work").mkdir()
    ctx.write("work/mine.txt", "x")
    return ["bench", "cpu", "--sections", "load", "--workdir", str(ctx.tmp / "work"),
            "--out", str(ctx.tmp / "bench.json")]


CATALOGUE = [
    Bad("out-is-a-copied-report-with-a-user-plot",
        lambda ctx: _report_copied_without_manifest(ctx, user_png=True),
        Error(("refusing to replace", "plots/mine.png"))),
    Bad("out-is-a-copied-report", lambda ctx: _report_copied_without_manifest(ctx, user_png=False),
        Handled(_copy_replaced)),
    Bad("kimi-shaped-over-user-files", _kimi_over_user_checkpoint,
        Error(("refusing to replace", "config.json", "OUT"))),
    Bad("kimi-shaped-over-its-own-output", _kimi_twice, Handled(_kimi_replaced)),
    Bad("compare-out-over-a-user-file", _compare_over_notes, Error(("refusing to replace", "notes.md"))),
    Bad("bench-render-out-over-a-user-file", _bench_render_over_notes,
        Error(("refusing to replace", "summary.md"))),
    Bad("bench-workdir-holds-user-files", _bench_workdir_with_files,
        Error(("refusing to replace", "mine.txt", "--workdir"))),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_write(bad, outcome, monkeypatch):
    monkeypatch.chdir(os.getcwd())
    ctx = outcome(bad)
    if bad.id == "out-is-a-copied-report-with-a-user-plot":
        _user_png_kept(ctx)
    if bad.id == "kimi-shaped-over-user-files":
        _kimi_files_kept(ctx)
    if bad.id.endswith("over-a-user-file"):
        name = "notes.md" if bad.id.startswith("compare") else "summary.md"
        assert (ctx.tmp / name).read_text() in ("my notes", "my summary")
