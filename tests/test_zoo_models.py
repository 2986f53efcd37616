"""On the zoo's trained checkpoints: captured states equal transformers' own
output_hidden_states, for the Llama and the DeepSeek-V3 targets (bf16 and INT4), and the
demo case's report tells the seeds' story."""

import json

import pytest
import torch

from diag.target.capture import capture_pass
from diag.layouts import point
from diag.target.load import load_target
from diag.zoo import zoo_path


def _ids(path, n=40):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path))
    text = "def read_config(path):\n    \"\"\"Read a config file.\"\"\"\n    with open(path) as fh:\n"
    return torch.tensor([tok(text)["input_ids"][:n]])


@pytest.mark.parametrize("name", ["llama-tiny", "deepseek-tiny", "deepseek-tiny-int4"])
@torch.no_grad()
def test_capture_equals_output_hidden_states(name):
    path = zoo_path(name)
    model, info = load_target(path, dtype=torch.float32)
    n = info.num_layers
    ids = _ids(path)
    points = tuple(point(p) for p in ["embed", "L1", f"L{n - 1}", f"L{n}", "final"])
    got = capture_pass(model, ids, torch.ones_like(ids), points)
    ref = model(ids, output_hidden_states=True)
    hs = ref.hidden_states
    assert len(hs) == n + 1
    torch.testing.assert_close(got.states["embed"], hs[0])
    torch.testing.assert_close(got.states["L1"], hs[1])
    torch.testing.assert_close(got.states[f"L{n - 1}"], hs[n - 1])
    torch.testing.assert_close(got.states["final"], hs[n])
    torch.testing.assert_close(model.model.norm(got.states[f"L{n}"]), hs[n])
    assert torch.equal(got.argmax, ref.logits.argmax(-1))


@torch.no_grad()
def test_int4_target_states_match_transformers_compressed_tensors():
    """diag's packed INT4 path vs transformers' own loading (which dequantizes at load)."""
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM
    path = zoo_path("deepseek-tiny-int4")
    ours, _ = load_target(path, dtype=torch.bfloat16)
    theirs = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16)
    theirs.config._experts_implementation = "eager"
    ids = _ids(path)
    a = ours(ids, output_hidden_states=True)
    b = theirs(ids, output_hidden_states=True)
    for x, y in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(x.float(), y.float(), rtol=2e-2, atol=2e-2)


def test_demo_tells_the_seeds_story(tmp_path):
    """The built-in demo, as `diag run` runs it (issue 19): the drafter trained on embed+L2+L4
    ships vLLM-convention ids that SGLang's Llama rule serves as L1+L3+L5. The first verdict is
    the LAYOUT MISMATCH with the ids that fix it, then the EAGLE-mode warning; step costs diag
    measured on this machine price the trees but give no verdict (issue 15). The contrast is the
    seeds' (issue 19: trained >= 2.6, served <= 1.7): measured 3.08 trained against 1.48 served
    on chain-3 (2.82 / 1.54 with the target trained under sdpa attention; 2.81 / 1.44 with that
    target and the drafter's seed 3). The bounds leave room for another CPU's
    rounding (a build elsewhere is another draw); the recipe before (2.45 / 1.70 here) fails them."""
    from diag.cli.main import main
    out = tmp_path / "demo"
    assert main(["run", "--out", str(out), "--quiet"]) == 0
    rep = json.loads((out / "report.json").read_text())
    kinds = [v["kind"] for v in rep["verdicts"]]
    assert kinds[:2] == ["layout-mismatch", "eagle-algorithm"], kinds
    judged = [v for v in rep["verdicts"] if v["kind"] in ("tree-choice", "speedup")]
    assert all(v["severity"] == "info" and "not judged" in v["text"] for v in judged), judged   # measured costs decide nothing
    mismatch = rep["verdicts"][0]["evidence"]
    assert (mismatch["serving"], mismatch["trained"], mismatch["fix_ids"]) == ("L1+L3+L5", "embed+L2+L4", [-1, 1, 3])
    assert "[-1, 1, 3]" in rep["verdicts"][0]["text"] and mismatch["ci95"][0] > 0
    assert mismatch["trained_accept_length"] > mismatch["serving_accept_length"] + 0.9
    assert mismatch["serving_accept_length"] < 1.8 and mismatch["trained_accept_length"] > 2.5
    trained = next(v for v in rep["verdicts"] if v["kind"] == "trained-layout")
    assert trained["evidence"]["best"] == "embed+L2+L4"
    assert "L1+L3+L5" not in [t["layout"] for t in trained["evidence"]["indistinguishable"]]
    trees = {e["tree"] for e in rep["evaluations"]}
    assert len(trees) >= 6 and len(rep["target_pass"]["regimes"]) == 1
    eagle = [e for e in rep["evaluations"] if e["mode"] == "eagle"]
    assert eagle and all(e["accept_length"] <= 1.05 for e in eagle if e["tree"] == "chain-3")
    assert all(e["accept_length"] <= 1.1 for e in eagle)          # four beams hit now and then: 1.055 at s3-k4
