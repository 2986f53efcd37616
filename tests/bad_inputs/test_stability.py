"""Two runs on the same inputs give the same report.json apart from timings and provenance,
with the cache and without it (issue 16): nothing in a report depends on the run's history."""

import json

import pytest

from diag.cli.main import main

# What may differ between two runs: when and how long (timings), where and with what
# (provenance), and whether the target pass came from the cache (its key and seconds).
VOLATILE = {"timings", "provenance", "created", "argv"}


def _stable(rep: dict) -> dict:
    out = {k: v for k, v in rep.items() if k not in VOLATILE}
    tp = dict(out.get("target_pass") or {})
    tp["regimes"] = {r: {k: v for k, v in m.items() if k not in ("cached", "cache_key", "seconds")}
                     for r, m in tp.get("regimes", {}).items()}
    out["target_pass"] = tp
    return out


@pytest.fixture
def case_file(pair, tmp_path):
    """A case with the user's own step costs, so the speedup section is no measurement."""
    body = (f'version = 1\nname = "stable"\n[target]\npath = "{pair["target"]}"\n[drafter]\n'
            f'path = "{pair["drafter"]}"\n[prompts]\nfile = "{pair["prompts"]}"\nmax_new_tokens = 10\n'
            '[evaluate]\nlayouts = ["embed+L2+L3", "L1+L2+L3"]\ntrees = ["chain-2", "s2-k2-d4"]\n'
            'modes = ["eagle3", "eagle"]\n'
            '[speedup]\nt_decode_ms = 20.0\nt_draft_ms = 1.5\nt_verify_ms = {"3" = 21.0, "4" = 22.0}\n')
    path = tmp_path / "case.toml"
    path.write_text(body)
    return path


def _report(case_file, out, *flags) -> dict:
    assert main(["run", str(case_file), "--out", str(out), "--quiet", *flags]) == 0
    return json.loads((out / "report.json").read_text())


def test_two_runs_give_the_same_report_with_and_without_the_cache(case_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    plain = [_report(case_file, tmp_path / f"n{i}", "--no-cache") for i in range(2)]
    cached = [_report(case_file, tmp_path / f"c{i}") for i in range(2)]    # computes, then reads
    assert not cached[0]["target_pass"]["regimes"]["as-loaded"]["cached"]
    assert cached[1]["target_pass"]["regimes"]["as-loaded"]["cached"]
    assert _stable(plain[0]) == _stable(plain[1])
    assert _stable(cached[0]) == _stable(cached[1])
    assert _stable(plain[0]) == _stable(cached[1])
    assert set(plain[0]) - set(_stable(plain[0])) <= VOLATILE
