"""samples.jsonl: one line per verify round a real decode visits, consistent with the
report's counts: per prompt and variant, each round's root position moves by a + 1."""

import json
from collections import defaultdict

from diag.cli.main import main
from tiny import make_drafter, make_prompts, make_target, write_case


def test_samples_follow_the_trajectory(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    case = write_case(tmp_path / "c.toml", make_target(tmp_path / "t"), make_drafter(tmp_path / "d"),
                      make_prompts(tmp_path / "p.jsonl"), trees=["chain-2", "s2-k2-d4"])
    out = tmp_path / "r"
    assert main(["run", str(case), "--out", str(out), "--quiet"]) == 0
    rep = json.loads((out / "report.json").read_text())
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    by = defaultdict(list)
    for r in rows:
        by[(r["variant"], r["prompt"])].append(r)
    for (variant, _), rs in by.items():
        assert [r["round"] for r in rs] == list(range(len(rs)))
        for prev, nxt in zip(rs, rs[1:]):
            assert nxt["position"] == prev["position"] + prev["accepted"] + 1
    for e in rep["evaluations"]:
        mine = [r for r in rows if r["variant"] == e["key"]]
        assert len(mine) == e["trajectory"]["rounds"]
        hist = [0] * (e["num_steps"] + 1)
        for r in mine:
            hist[r["accepted"]] += 1
        assert hist == e["trajectory"]["accepted_hist"]
