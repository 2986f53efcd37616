"""The engine's versioned rules: one worked example per correction (issue 17), the version
registry, `diag explain` across every known version, and `--engine` on the commands.
(tests/test_sglang_*.py prove the same rules against SGLang's own code.)"""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest

from diag.cli.main import main
from diag.engines.sglang.accept_rate import FORMULAS, formula_for, versions_of
from diag.engines.sglang.drafter_keys import fc_inputs, uses_aux_hidden_state
from diag.engines.sglang.explain import explain
from diag.engines.sglang.launch import effective_config, parse_launch
from diag.engines.sglang.serving import ServingError, fix_for, later_serving, serving_ids, serving_plan, try_serving_plan
from diag.engines.sglang.tree_rules import auto_defaults
from diag.engines.sglang.versions import DEFAULT_ENGINE, RELEASES, engine, release, since, span
from diag.errors import DiagError
from diag.layouts import layout

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168}}
DSV3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "num_hidden_layers": 61, "hidden_size": 7168}
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 61, "hidden_size": 7168}
QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 36, "hidden_size": 4096}


def drafter(ids=None, **extra):
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168, "draft_vocab_size": 32000,
           "vocab_size": 163840, **extra}
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, **cfg.get("eagle_config", {})}
    return cfg


# ---- the registry ------------------------------------------------------------------------

def test_every_release_from_056_to_0523_is_known_and_the_newest_is_default():
    assert RELEASES[0] == "0.5.6" and RELEASES[-1] == "0.5.23" and len(RELEASES) == 25
    assert [release(v) for v in RELEASES] == sorted(release(v) for v in RELEASES)
    assert DEFAULT_ENGINE == "sglang-0.5.23" and engine().name == DEFAULT_ENGINE
    assert engine("0.5.10.post1") is engine("sglang-0.5.10.post1")


def test_unknown_version_lists_the_known_ones():
    with pytest.raises(DiagError) as err:
        engine("sglang-0.5.5")
    text = str(err.value)
    assert "sglang-0.5.6" in text and "sglang-0.5.23" in text and "0.5.5" in text


def test_since_and_span_worked_example():
    table = (("0.5.6", "legacy"), ("0.5.11", "drafts-only"))
    assert since(table, "sglang-0.5.10.post1") == "legacy" and since(table, "0.5.11") == "drafts-only"
    assert span(table, 0) == "0.5.6–0.5.10.post1" and span(table, 1) == "0.5.11–0.5.23"


# ---- correction 1: auto tree defaults -----------------------------------------------------

def test_auto_defaults_kimi_and_qwen3_get_a_chain_since_058():
    assert auto_defaults("KimiK25ForConditionalGeneration", "0.5.23")[0] == (3, 1, 4)
    assert auto_defaults("Qwen3ForCausalLM", "0.5.8")[0] == (3, 1, 4)
    assert auto_defaults("Qwen3ForCausalLM", "0.5.7")[0] == (5, 4, 8)
    assert auto_defaults("LlamaForCausalLM", "0.5.23")[0] == (5, 4, 8)
    assert auto_defaults("Grok1ForCausalLM", "0.5.23")[0] == (5, 4, 8)
    assert auto_defaults("LlamaForCausalLM", "0.5.23", "STANDALONE")[0] == (3, 1, 4)
    assert auto_defaults("MiMoV2FlashForCausalLM", "0.5.6.post2")[0] == (5, 4, 8)   # listed from 0.5.7
    assert auto_defaults("MiMoV2FlashForCausalLM", "0.5.7")[0] == (3, 1, 4)
    bare = parse_launch("python -m sglang.launch_server --model-path k --speculative-algorithm EAGLE3")
    assert effective_config(bare, KIMI).tree.shape.name == "chain-3"
    assert effective_config(bare, KIMI, engine_name="0.5.7").tree.shape.name == "s5-k4-d8"
    assert effective_config(bare, KIMI).engine == "sglang-0.5.23"


# ---- correction 2: DeepSeek / Kimi targets capture the embeddings since 0.5.14 -------------

def test_kimi_serves_embed_l3_l31_with_ids_0_3_31():
    plan = serving_plan(drafter([0, 3, 31]), KIMI)
    assert str(plan.layout) == "embed+L3+L31" and plan.convention == "sglang-deepseek"
    assert serving_ids(layout("embed+L3+L31"), KIMI) == [0, 3, 31]
    assert str(serving_plan(drafter([0, 1, 2]), KIMI).layout) == "embed+L1+L2"   # no serving error


def test_embeddings_before_0514_are_a_serving_error_with_an_upgrade_fix():
    err = try_serving_plan(drafter([0, 3, 31]), KIMI, engine_name="0.5.13")
    assert isinstance(err, ServingError) and "residual index 0" in str(err)
    fix = fix_for(layout("embed+L3+L31"), KIMI, engine_name="0.5.13")
    assert fix.ids is None and fix.upgrade == ("0.5.14", [0, 3, 31])
    assert "upgrade to SGLang 0.5.14" in fix.text and "retrain" in fix.text
    assert later_serving(layout("embed+L3+L31"), KIMI, engine_name="0.5.23") is None


def test_llama_embeddings_need_0522():
    assert str(serving_plan(drafter([-1, 2, 30]), LLAMA).layout) == "embed+L3+L31"
    assert isinstance(try_serving_plan(drafter([-1, 2, 30]), LLAMA, engine_name="0.5.21"), ServingError)
    assert fix_for(layout("embed+L3+L31"), LLAMA, engine_name="0.5.21").upgrade == ("0.5.22", [-1, 2, 30])


# ---- correction 3: the accept-rate formula changed in 0.5.11 ------------------------------

def test_accept_rate_formula_by_version():
    assert formula_for("0.5.10.post1") == "sglang_accept_rate_legacy"
    assert formula_for("0.5.11") == "sglang_accept_rate"
    assert versions_of("sglang_accept_rate_legacy") == "0.5.6–0.5.10.post1"
    assert FORMULAS["sglang_accept_rate"].startswith("SGLang 0.5.11–0.5.23")


@pytest.mark.parametrize("version", RELEASES)
def test_explain_version_matrix(version):
    """The seed log (1.68 / 0.84, flags S1 K1 D16) fits the legacy formula at D = 2 only, so
    only a server at 0.5.10.post1 or older logs it; a 0.5.11+ log of the same round counts
    (a = 0.68 per round on average, D = 2 -> rate 0.68) fits only the newer versions."""
    seed = explain(1.68, 0.84, num_steps=1, topk=1, num_draft_tokens=16, engine_name=version)
    newer = explain(1.68, 0.68, num_steps=1, topk=1, num_draft_tokens=16, engine_name=version)
    old = release(version) <= release("0.5.10.post1")
    assert seed.versions == ("0.5.6–0.5.10.post1",) and newer.versions == ("0.5.11–0.5.23",)
    assert seed.engine_fits is old and newer.engine_fits is (not old)
    assert seed.resolved.shape.num_draft_tokens == 2
    assert ("consistent at D = 2" in seed.sentences[-1]) is old


# ---- correction 4: only 0.5.23 was known; the DeepSeek rule was +1 until 0.5.12.post1 ---------

def test_deepseek_ids_before_0513_are_shifted_like_llama():
    assert str(serving_plan(drafter([2, 30, 58]), DSV3, engine_name="0.5.12.post1").layout) == "L3+L31+L59"
    assert str(serving_plan(drafter([2, 30, 58]), DSV3, engine_name="0.5.13").layout) == "L2+L30+L58"
    assert serving_plan(drafter([2, 30, 58]), KIMI, engine_name="0.5.12.post1").engine == "sglang-0.5.12.post1"


def test_kimi_wrapper_before_0510_cannot_capture():
    for version, why in (("0.5.8", "no KimiK25ForConditionalGeneration"), ("0.5.9", "no set_eagle3_layers_to_capture")):
        err = try_serving_plan(drafter([2, 30, 58]), KIMI, engine_name=version)
        assert isinstance(err, ServingError) and why in err.message


def test_cuda_graph_decode_rounds_capture_defaults_up_to_05101():
    plan = serving_plan(drafter([0, 3, 31]), LLAMA, engine_name="0.5.10")
    assert str(plan.layout) == "L2+L30+L58" and str(plan.prefill_layout) == "L1+L4+L32"
    assert any("--disable-cuda-graph" in w for w in plan.warnings)
    eager = serving_plan(drafter([0, 3, 31]), LLAMA, engine_name="0.5.10", cuda_graph=False)
    assert str(eager.layout) == "L1+L4+L32" and eager.prefill_layout is None
    assert serving_plan(drafter([0, 3, 31]), LLAMA, engine_name="0.5.11").prefill_layout is None
    assert parse_launch("python -m sglang.launch_server --disable-cuda-graph --tp 8").disable_cuda_graph


# ---- corrections 5 and 6: embedding table, EAGLE vocabulary --------------------------------

def test_embedding_and_head_choice_in_the_plan():
    plan = serving_plan(drafter([2, 30, 58]), LLAMA)
    assert (plan.embed, plan.lm_head, plan.vocab_limit) == ("target", "drafter", None)
    own = serving_plan(drafter([2, 30, 58], hidden_size=4096, target_hidden_size=7168), LLAMA)
    assert own.embed == "drafter"
    eagle = serving_plan(drafter([2, 30, 58]), LLAMA, algorithm="EAGLE")
    assert (eagle.embed, eagle.lm_head, eagle.vocab_limit) == ("target", "target", 32000)


def test_replay_refuses_a_missing_own_embedding():
    import torch
    from diag.engines.sglang.draft_tables import draft_tables
    from diag.replay.replay import draft_head
    t = draft_tables("eagle3", hidden_size=16, target_hidden_size=32, draft_vocab_size=8, vocab_size=8)
    with pytest.raises(DiagError) as err:
        draft_head(NS(embed_tokens=None), None, None, t, torch.device("cpu"), torch.float32)
    assert err.value.field == "embed_tokens.weight"


# ---- correction 7: drafter config keys ------------------------------------------------------

def test_use_aux_hidden_state_false_feeds_the_final_state():
    cfg = drafter([2, 30, 58], eagle_config={"use_aux_hidden_state": False})
    plan = serving_plan(cfg, LLAMA)
    assert str(plan.layout) == "final" and plan.mode == "eagle3" and plan.lm_head == "drafter"
    assert uses_aux_hidden_state(cfg, "0.5.7")[0] is True          # read since 0.5.8
    assert str(serving_plan(cfg, LLAMA, engine_name="0.5.7", cuda_graph=False).layout) == "L3+L31+L59"
    top = drafter([2, 30, 58], use_aux_hidden_state=False)          # top level: never read
    assert uses_aux_hidden_state(top, "0.5.23")[0] is True and "ignored" in uses_aux_hidden_state(top, "0.5.23")[1]


def test_fc_sizing_by_version_and_drafter_architecture():
    two = drafter([0, 3])
    assert fc_inputs(two, "0.5.11")[0] == 3 and fc_inputs(two, "0.5.12")[0] == 2
    assert "3 states" in try_serving_plan(two, LLAMA, engine_name="0.5.11").message
    assert not isinstance(try_serving_plan(two, LLAMA, engine_name="0.5.12"), ServingError)
    num = drafter(None, num_aux_hidden_states=2)
    assert isinstance(try_serving_plan(num, LLAMA), ServingError)   # fc for 2, captures 3 defaults
    mla = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "eagle_aux_hidden_state_layer_ids": [5, 6]}
    assert fc_inputs(mla, "0.5.23")[0] == 2                         # top-level ids size fc here
    assert fc_inputs({**mla, "architectures": ["LlamaForCausalLMEagle3"]}, "0.5.23")[0] == 3


# ---- the commands name the version -----------------------------------------------------------

def test_explain_and_effective_take_engine(capsys):
    assert main(["explain", "--accept-len", "1.68", "--accept-rate", "0.84", "--engine", "0.5.10"]) == 0
    assert "SGLang 0.5.10 logs sglang_accept_rate_legacy" in capsys.readouterr().out
    assert main(["explain", "--accept-len", "1.68", "--accept-rate", "0.84", "--engine", "0.5.23",
                 "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "sglang-0.5.23" and out["engine_fits"] is False
    assert out["versions"] == ["0.5.6–0.5.10.post1"]
    assert main(["effective", "--engine", "0.5.7", "--", "python", "-m", "sglang.launch_server",
                 "--model-path", "m", "--speculative-algorithm", "EAGLE3"]) == 0
    assert "engine: sglang-0.5.7" in capsys.readouterr().out
    assert main(["explain", "--accept-len", "1.5", "--accept-rate", "0.5", "--engine", "0.4.0"]) == 2
    assert "unknown serving engine version" in capsys.readouterr().err


def test_lint_fix_for_a_kimi_drafter_trained_on_embed_l3_l31(tmp_path, capsys):
    """The issue's worked example: drafter trained on embed+L3+L31 (diag_trained_layout),
    ids [2, 30, 58], Kimi target: on 0.5.23 the fix is [0, 3, 31]; on 0.5.13 no ids serve it."""
    from test_lint import write_drafter
    from diag.checks.lint import lint
    t = tmp_path / "t"
    t.mkdir()
    (t / "config.json").write_text(json.dumps({**KIMI, "text_config": {**KIMI["text_config"], "hidden_size": 32,
                                                                      "vocab_size": 100}}))
    d = write_drafter(tmp_path / "d", eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 30, 58]},
                      diag_trained_layout="embed+L3+L31")
    found = [f for f in lint(d, t, None) if f.code == "LAYOUT_MISMATCH"]
    assert len(found) == 1 and "= [0, 3, 31]" in found[0].fix and found[0].engine == "sglang-0.5.23"
    old = [f for f in lint(d, t, None, engine="0.5.13") if f.code == "LAYOUT_MISMATCH"]
    assert "upgrade to SGLang 0.5.14" in old[0].fix and old[0].engine == "sglang-0.5.13"
    assert all(f.engine == "sglang-0.5.13" for f in lint(d, t, None, engine="0.5.13"))
    assert main(["lint", "--drafter", str(d), "--target", str(t), "--engine", "0.5.13"]) == 1
    assert "sglang 0.5.13:" in capsys.readouterr().out


# ---- the verdicts' fixes ---------------------------------------------------------------------

def _run(engine_name: str, error: ServingError | None):
    from diag.replay.evaluation import ANY, Axes
    case = NS(serving=NS(engine=engine_name), evaluate=NS(seed=0, bootstrap=10))
    return NS(serving_error=error, case=case, evaluations=[], candidates=[],
              reference=Axes(ANY, "eagle3", "chain-3", "as-loaded", "as-loaded"))


def _trained(lay: str):
    from diag.run.verdicts.record import Verdict
    return Verdict("trained-layout", "info", "t", {"indistinguishable": [
        {"layout": lay, "roles": ["declared (diag_trained_layout)"]}]})


def test_serving_error_verdict_fix_names_the_version():
    from diag.run.verdicts.serving_error import serving_error_verdicts
    err = try_serving_plan(drafter([0, 3, 31]), KIMI, engine_name="0.5.13")
    (v,) = serving_error_verdicts(_run("sglang-0.5.13", err), [_trained("embed+L3+L31")], KIMI)
    assert v.text.startswith("SERVING ERROR: sglang-0.5.13 cannot serve")
    assert "upgrade to SGLang 0.5.14" in v.text and v.evidence["upgrade"] == {"version": "0.5.14", "ids": [0, 3, 31]}
    assert v.evidence["fix_ids"] is None and v.evidence["engine"] == "sglang-0.5.13"
    err = try_serving_plan(drafter([2, 30, 70]), KIMI)               # id 70 is past the last layer
    (v,) = serving_error_verdicts(_run("sglang-0.5.23", err), [_trained("embed+L3+L31")], KIMI)
    assert v.evidence["fix_ids"] == [0, 3, 31] and "retrain" not in v.text


def test_serving_error_on_a_missing_draft_vocab_size_proposes_the_key_not_ids():
    from diag.run.verdicts.serving_error import serving_error_verdicts
    cfg = drafter([0, 3, 31])
    cfg.pop("draft_vocab_size", None)
    err = try_serving_plan(cfg, KIMI)
    assert isinstance(err, ServingError) and err.field == "draft_vocab_size"
    (v,) = serving_error_verdicts(_run("sglang-0.5.23", err), [_trained("embed+L3+L31")], KIMI)
    assert "Fix: set draft_vocab_size in the drafter's config.json to a number" in v.text
    assert "AttributeError" in v.text and v.evidence["fix_ids"] is None and "[0, 3, 31]" not in v.text.split("Fix:")[1]


def test_layout_mismatch_fix_comes_from_the_engine():
    from diag.run.verdicts.layout import _fix
    text, evidence = _fix("embed+L3+L31", _run("sglang-0.5.23", None), KIMI)
    assert "= [0, 3, 31]" in text and evidence["fix_ids"] == [0, 3, 31]
    text, evidence = _fix("final (EAGLE)", _run("sglang-0.5.23", None), KIMI)
    assert text == "" and evidence == {}
