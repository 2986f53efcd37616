"""bench/accept_parts: the accept step and its parts timed on synthetic rounds (small on the CPU);
the rounds are trees of the shape asked for, deep walks among them; the GPU bench's "accept"
section runs alone, before any checkpoint."""

import json

import torch

from diag.bench.accept_parts import DECODING, accept_parts, synthetic_round
from diag.replay.accept import accept_dense
from diag.replay.verifiers import sampled_rule
from diag.trees import tree_shape

PARTS = {"accept_dense", "tempered", "top_p_kept", "window_topk", "capacity_sort", "bonus"}


def test_a_synthetic_round_is_a_tree_of_the_shape_whose_walks_go_deep():
    for tree in ("chain-3", "s3-k4-d8"):
        shape = tree_shape(tree)
        t, logits, coins, S = synthetic_round(tree, 64, 5000, torch.float32, "cpu")
        D = shape.num_draft_tokens
        assert logits.shape == (64, D, 5000) and coins.shape == (64, D + 1) and S == shape.num_steps
        par, dep = t["parents"], t["depths"]
        assert (par[:, 0] == -1).all() and (par[:, 1:] < torch.arange(1, D)).all() and (par[:, 1:] >= 0).all()
        assert dep.max() <= S and torch.equal(dep[:, 1:], dep.gather(1, par[:, 1:]) + 1)
        res, _, _ = accept_dense(sampled_rule("tree-target-only"), t, logits, DECODING, coins, S, unsynced=True)
        assert res.accepted.float().mean() > 0.5 * S                           # the spikes are the tokens


def test_accept_parts_times_every_part_for_each_tree_and_dtype():
    got = accept_parts(device="cpu", trees=("chain-1", "s3-k4-d5"), rows=4, vocab=5000, reps=1)
    assert [(r["tree"], r["logits"]) for r in got["rows"]] == [
        ("chain-1", "float32"), ("chain-1", "bfloat16"), ("s3-k4-d5", "float32"), ("s3-k4-d5", "bfloat16")]
    for r in got["rows"]:
        assert set(r["ms"]) == PARTS and all(v > 0 for v in r["ms"].values())
        assert r["nodes"] == tree_shape(r["tree"]).num_draft_tokens and r["capacity_rows"] == 8
    assert got["timing"].startswith("bench.common.timed: median of 3")


def test_the_gpu_benchs_accept_section_runs_alone_before_any_checkpoint(tmp_path, monkeypatch):
    import diag.bench.accept_parts as parts
    from diag.bench.gpu import run
    monkeypatch.setattr(parts, "accept_parts", lambda device: {"rows": [], "device": device})
    res = run(tmp_path / "g.json", tmp_path / "w", sections=("accept",), device="cpu", layers=2)
    assert set(res["sections"]) == {"ceilings", "accept"} and res["sections"]["accept"]["device"] == "cpu"
    assert json.loads((tmp_path / "g.json").read_text())["sections"]["accept"]["rows"] == []
    assert not (tmp_path / "w" / "kimi").exists()
