"""Bad drafters: broken files, NaN / Inf weights, configs that leave no candidate layout, fc
widths that fit no layout, d2t / t2d that disagree, and a broken drafter that loads fine but
predicts nothing (issue 16.3, 16.6). Each entry states its outcome."""

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bad_catalogue import Bad, Error, Handled
from diag.errors import DiagError

MID = "midlayer.self_attn.q_proj.weight"


def _poison(key, value):
    def edit(t):
        t[key] = t[key].clone()
        t[key].view(-1)[3] = value
    return edit


def _drafter_cfg(fn):
    return lambda c: c.run(drafter=c.drafter(config=fn))


def _no_scan(ctx, drafter):
    """A flags case with no --layout: the candidates come from the drafter's config alone."""
    return ["run", "--target", ctx.pair["target"], "--drafter", drafter, "--prompts", ctx.pair["prompts"],
            "--out", ctx.out, "--max-new-tokens", "8", "--tree", "chain-2", "--quiet"]


def _ids(ids):
    def edit(c):
        c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    return edit


def _fc(k):
    """fc.weight of a drafter that takes k capture points of width 32."""
    def edit(t):
        t["fc.weight"] = torch.zeros(32, 32 * k, dtype=t["fc.weight"].dtype)
    return edit


def _swap_d2t(t):
    t["d2t"] = t["d2t"].clone()
    t["d2t"][0] = 10 ** 6


def _t2d_off(t):
    t["t2d"] = t["t2d"].clone()
    t["t2d"][t["t2d"].nonzero()[0]] = False


def _drop(key):
    return lambda t: t.pop(key)


CATALOGUE = [
    Bad("drafter-dir-missing", lambda c: c.run(drafter=c.tmp / "nope"), Error(("does not exist",))),
    Bad("drafter-no-weights", lambda c: c.run(drafter=_unlink(c.drafter(), "model.safetensors")),
        Error(("model.safetensors",))),
    Bad("drafter-nan-in-midlayer", lambda c: c.run(drafter=c.drafter(tensors=_poison(MID, float("nan")))),
        Error(("NaN or Inf", MID, "model.safetensors"))),
    Bad("drafter-inf-in-lm-head", lambda c: c.run(drafter=c.drafter(tensors=_poison("lm_head.weight", float("-inf")))),
        Error(("NaN or Inf", "lm_head.weight", "1 Inf"))),
    Bad("drafter-nan-in-fc", lambda c: c.run(drafter=c.drafter(tensors=_poison("fc.weight", float("nan")))),
        Error(("NaN or Inf", "fc.weight"))),
    Bad("drafter-no-fc", lambda c: c.run(drafter=c.drafter(tensors=_drop("fc.weight"))), Error(("fc.weight",))),
    Bad("drafter-fc-not-a-multiple", lambda c: c.run(drafter=c.drafter(
        tensors=lambda t: t.__setitem__("fc.weight", torch.zeros(32, 50)))), Error(("fc.weight", "multiple"))),
    Bad("drafter-fc-fits-no-layout", lambda c: _no_scan(c, c.drafter(tensors=_fc(7))),
        Error(("fits no layout", "k = 7", "1 <= k <= 6"))),
    Bad("drafter-ids-out-of-range", lambda c: _no_scan(c, c.drafter(config=_ids([1, 2, 40]))),
        Error(("no candidate layout", "[1, 2, 40]", "4-layer"))),
    Bad("drafter-ids-missing", lambda c: _no_scan(c, c.drafter(config=lambda x: [x.pop("eagle_config"),
                                                                        x.pop("diag_trained_layout")])),
        Error(("no candidate layout", "names no layer ids"))),
    Bad("drafter-d2t-out-of-range", lambda c: c.run(drafter=c.drafter(tensors=_swap_d2t)),
        Error(("d2t maps draft ids outside", "d2t"))),
    Bad("drafter-t2d-disagrees", lambda c: c.run(drafter=c.drafter(tensors=_t2d_off)),
        Error(("d2t and t2d disagree", "t2d"))),
    Bad("drafter-missing-a-weight", lambda c: c.run(drafter=c.drafter(tensors=_drop("midlayer.mlp.down_proj.weight"))),
        Error(("missing a weight", "midlayer.mlp.down_proj.weight"))),
    Bad("drafter-extra-weight", lambda c: c.run(drafter=c.drafter(
        tensors=lambda t: t.__setitem__("midlayer.adapter.weight", torch.zeros(2, 2)))),
        Error(("does not use", "midlayer.adapter.weight"))),
    Bad("drafter-wrong-shape", lambda c: c.run(drafter=c.drafter(
        tensors=lambda t: t.__setitem__("norm.weight", torch.ones(31)))), Error(("wrong shape", "norm.weight"))),
    Bad("drafter-other-vocabulary", _drafter_cfg(lambda x: x.update(vocab_size=512)),
        Error(("vocabularies differ", "vocab_size", "512"))),
    Bad("drafter-other-target-width", _drafter_cfg(lambda x: x.update(target_hidden_size=64)),
        Error(("another target width", "target_hidden_size", "64"))),
    Bad("drafter-config-lacks-heads", _drafter_cfg(lambda x: x.pop("num_attention_heads")),
        Error(("num_attention_heads", "missing"))),
]


def _unlink(path: Path, name: str) -> Path:
    (path / name).unlink()
    return path


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_drafter(bad, outcome):
    outcome(bad)


# ---- a drafter that loads fine and predicts nothing (16.3) ---------------------------------

def test_permuted_d2t_predicts_nothing_and_never_matches(tmp_path, monkeypatch):
    """The regression of 16.3: the zoo's trained drafter with its d2t permuted consistently
    with t2d loads without complaint and gets accept length 1.00 on every layout; the serving
    layout used to win the tie and be declared a match. Now: an error verdict that the drafter
    predicts nothing, the d2t check failing, and no layout verdict at all."""
    from diag.zoo import zoo_path
    from diag.run.case import parse_case
    from diag.run.pipeline import run_case
    d = shutil.copytree(zoo_path("llama-tiny-eagle3-embed"), tmp_path / "d")
    t = load_file(str(d / "model.safetensors"))
    n = len(t["d2t"])
    mapped = torch.arange(n) + t["d2t"]
    t["d2t"] = mapped[torch.randperm(n, generator=torch.Generator().manual_seed(0))] - torch.arange(n)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    target = str(zoo_path("llama-tiny"))          # the shared zoo, before the test's own cache
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    case = parse_case({"version": 1, "name": "floor", "target": {"path": target, "dtype": "float32"},
                       "drafter": {"path": str(d), "dtype": "float32"},
                       "prompts": {"file": str(Path("cases/prompts/mixed-48.jsonl").resolve()),
                                   "max_new_tokens": 24, "limit": 6},
                       "evaluate": {"layouts": ["embed+L2+L4", "L1+L3+L5"], "trees": ["chain-3"],
                                    "modes": ["eagle3", "eagle"]}}, "<test>")
    run = run_case(case, progress=False)
    kinds = {v.kind: v for v in run.verdicts}
    assert "drafter-predicts-nothing" in kinds and kinds["drafter-predicts-nothing"].severity == "error"
    assert "target-output-garbage" not in kinds          # the trained target is fine: the drafter is blamed
    assert not {"layout-match", "layout-mismatch", "trained-layout", "eagle-algorithm"} & set(kinds)
    checks = {c["name"]: c for c in kinds["drafter-predicts-nothing"].evidence["checks"]}
    assert not checks["d2t order"]["ok"] and checks["weights finite"]["ok"]
    assert "[FAIL] d2t order" in kinds["drafter-predicts-nothing"].text
    assert "matches" not in " ".join(v.text for v in run.verdicts)


def test_health_checks_name_a_constant_head_and_low_coverage():
    import tiny
    from diag.drafter.checkpoint import load_drafter
    from diag.drafter.health import d2t_descents, health_checks
    with tempfile.TemporaryDirectory() as tmp:
        model, _ = load_drafter(tiny.make_drafter(Path(tmp) / "d"))
    with torch.no_grad():
        model.lm_head.weight.zero_()
    hot = model.to_target_ids(torch.arange(model.cfg.draft_vocab_size))
    cold = torch.tensor([i for i in range(model.cfg.vocab_size) if i not in set(hot.tolist())])
    checks = {c.name: c for c in health_checks(model, cold[:40])}
    assert not checks["constant weights"].ok and "lm_head.weight" in checks["constant weights"].detail
    assert not checks["vocab coverage"].ok and "0%" in checks["vocab coverage"].detail
    assert checks["d2t order"].ok
    assert d2t_descents(torch.tensor([5, -1, 7])) == 1       # mapped [5, 0, 9]


def test_floor_verdict_needs_every_candidate_at_the_floor():
    """A drafter that works on one layout is not at the floor, whatever the others do."""
    from types import SimpleNamespace
    from diag.replay.evaluation import Axes
    from diag.run.verdicts.floor import at_floor
    ref = Axes(mode="eagle3", tree="chain-3", regime="as-loaded", tokens_regime="as-loaded")

    def ev(layout, acc, hi):
        return SimpleNamespace(axes=Axes(layout, "eagle3", "chain-3", "as-loaded", "as-loaded"),
                               layout=layout, accept_length=acc, accept_length_ci95=(1.0, hi))
    flat = [ev("a", 1.0, 1.0), ev("b", 1.02, 1.06)]
    assert at_floor(SimpleNamespace(evaluations=flat, reference=ref))
    assert not at_floor(SimpleNamespace(evaluations=flat + [ev("c", 1.4, 1.6)], reference=ref))


def test_nan_drafter_fails_in_the_loader_naming_the_tensor(tmp_path):
    import tiny
    from diag.drafter.checkpoint import load_drafter
    d = tiny.make_drafter(tmp_path / "d")
    t = load_file(str(d / "model.safetensors"))
    t["midlayer.mlp.gate_proj.weight"][0, 0] = float("nan")
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(DiagError, match="NaN or Inf") as err:
        load_drafter(d)
    assert "midlayer.mlp.gate_proj.weight" in str(err.value) and "first at [0, 0]" in str(err.value)
