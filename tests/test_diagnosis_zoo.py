"""Diagnoses on the zoo's trained pairs (DESIGN.md §1): a drafter whose ids are written in
another convention is caught, EAGLE mode collapses, and the INT4 story shows drift."""

import json
import shutil

import pytest

from diag.cli.main import main
from diag.zoo import zoo_path

pytestmark = pytest.mark.slow


def _drafter_with_ids(tmp_path, name: str, ids: list[int]):
    """A copy of a zoo drafter whose config declares `ids` (and no diag_trained_layout)."""
    out = tmp_path / name
    shutil.copytree(zoo_path(name), out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    cfg.pop("diag_trained_layout", None)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _run(tmp_path, drafter, *extra):
    out = tmp_path / "report"
    code = main(["run", "--target", str(zoo_path("llama-tiny")), "--drafter", str(drafter), "--out", str(out),
                 "--quiet", "--limit", "32", "--tree", "chain-3", *extra])
    assert code == 0
    return json.loads((out / "report.json").read_text())


def _trained_found(verdicts, trained):
    best = verdicts["trained-layout"]["evidence"]
    return trained == best["best"] or trained in [t["layout"] for t in best["indistinguishable"]]


def test_embed_drafter_with_vllm_ids_is_a_layout_mismatch(tmp_path):
    """Trained on embed+L2+L4, ids written as vLLM's L{id} = [0, 2, 4]; SGLang reads
    output-of-layer ids, L{id+1}: it serves L1+L3+L5 (the seed's story, DESIGN.md §1.2)."""
    rep = _run(tmp_path, _drafter_with_ids(tmp_path, "llama-tiny-eagle3-embed", [0, 2, 4]))
    verdicts = {v["kind"]: v for v in rep["verdicts"]}
    assert _trained_found(verdicts, "embed+L2+L4")
    mismatch = verdicts["layout-mismatch"]["evidence"]
    assert mismatch["serving"] == "L1+L3+L5" and mismatch["ci95"][0] > 0
    # Adjacent layers can tie at the top of the scan (the fifth stop's zoo: embed+L3+L4 2.83,
    # embed+L2+L4 2.82 over 48 prompts); the verdict then names the tied layout the config's ids
    # read under vLLM's rule (this zoo: embed+L2+L4 3.08 is best outright).
    assert mismatch["trained"] == "embed+L2+L4" and mismatch["fix_ids"] == [-1, 1, 3]
    best = verdicts["trained-layout"]["evidence"]["best"]
    assert best == "embed+L2+L4" or f"tied with the scan's best, {best}" in verdicts["layout-mismatch"]["text"]


def test_l1_drafter_with_vllm_ids_is_a_serving_error(tmp_path):
    """Trained on L1+L3+L5, ids written as vLLM's L{id} = [1, 3, 5]; SGLang would capture
    L2+L4+L6, but L6 (the last layer's output) is never captured inside its layer loop:
    only two states reach fc. diag names the trained layout and the ids that fix it."""
    rep = _run(tmp_path, _drafter_with_ids(tmp_path, "llama-tiny-eagle3-l1", [1, 3, 5]))
    verdicts = {v["kind"]: v for v in rep["verdicts"]}
    assert _trained_found(verdicts, "L1+L3+L5")
    err = verdicts["serving-error"]
    assert err["severity"] == "error" and "[0, 2, 4]" in err["text"]


def test_eagle_mode_collapses_with_a_reason(tmp_path):
    rep = _run(tmp_path, zoo_path("llama-tiny-eagle3-embed"), "--algorithm", "EAGLE")
    v = next(v for v in rep["verdicts"] if v["kind"] == "eagle-algorithm")
    assert v["severity"] == "error" and "final-normed" in v["text"]
    assert v["evidence"]["accept_length"] <= 1.05


def test_int4_story_reports_drift_and_acceptance_change(tmp_path):
    out = tmp_path / "int4"
    assert main(["run", "cases/deepseek-int4.toml", "--out", str(out), "--quiet", "--limit", "24"]) == 0
    rep = json.loads((out / "report.json").read_text())
    sec = rep["regimes"]
    assert sec["reference"] == "ckpt:zoo:deepseek-tiny"
    int4 = next(r for r in sec["regimes"] if r["regime"] == "as-loaded")
    assert 0.9 < int4["drift"]["L3"]["cosine"] < 1.0
    assert "vs_reference" in int4 and len(int4["vs_reference"]["ci95"]) == 2
    assert {(c["features"], c["tokens"]) for c in sec["cross"]} >= {("as-loaded", "ckpt:zoo:deepseek-tiny"),
                                                                   ("ckpt:zoo:deepseek-tiny", "as-loaded")}
    assert any(v["kind"] == "quantization" for v in rep["verdicts"])


def test_mla_drafter_replays_chains_and_beams(tmp_path):
    """The zoo's Kimi-style drafter (Eagle3DeepseekV2ForCausalLM, EAGLE-3.1 fc_norm + norm_output)
    plugs into drafting and replay like the Llama one: chains and SGLang's top-K beams."""
    out = tmp_path / "mla"
    code = main(["run", "--target", str(zoo_path("deepseek-tiny")), "--drafter", str(zoo_path("deepseek-tiny-eagle3-mla")),
                 "--out", str(out), "--quiet", "--limit", "12", "--layout", "embed+L2+L3", "--layout", "L1+L2+L3",
                 "--tree", "chain-3", "--tree", "s3-k2-d5"])
    assert code == 0
    rep = json.loads((out / "report.json").read_text())
    d = rep["drafter"]
    assert (d["architecture"], d["attention"], d["variant"]) == ("Eagle3DeepseekV2ForCausalLM", "mla", "eagle3.1")
    assert d["options"]["fc_norm"] and d["options"]["norm_output"]
    acc = {(e["layout"], e["tree"]): e["accept_length"] for e in rep["evaluations"] if e["mode"] == "eagle3"}
    assert acc[("embed+L2+L3", "chain-3")] > 2.0
    assert acc[("embed+L2+L3", "s3-k2-d5")] > 2.0                                      # the beam drafts too
    # No order between the two layouts is asserted: this drafter barely reads its states (fc_norm
    # at deepseek-tiny's width; over 48 prompts embed+L2+L3 3.45, L1+L2+L3 3.44, L1+L3+L4 within
    # the same interval), so which one leads on 12 prompts is a coin the build's rounding flips.
    assert set(acc) == {(lay, tree) for lay in ("embed+L2+L3", "L1+L2+L3") for tree in ("chain-3", "s3-k2-d5")}
