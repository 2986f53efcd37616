"""ServingPlan: what SGLang 0.5.23 feeds the drafter, from config dicts only."""

import pytest

from diag.errors import DiagError
from diag.engines.sglang.algorithms import mode_of
from diag.engines.sglang.architectures import auto_defaults_key, capture_model
from diag.engines.drafter_ids import declared_layouts, nested_ids, top_level_ids
from diag.engines.sglang.serving import ServingError, serving_ids, serving_plan, try_serving_plan
from diag.layouts import layout

KIMI = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "num_hidden_layers": 61, "hidden_size": 7168}
KIMI_WRAPPED = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                "text_config": {"model_type": "kimi_k2", "num_hidden_layers": 61,
                                "hidden_size": 7168}}
LLAMA = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 61, "hidden_size": 7168}


def drafter(ids=None, top=None, hidden=7168, **extra):
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": hidden,
           "draft_vocab_size": 32000, "vocab_size": 163840, **extra}
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    if top is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top
    return cfg


def test_capture_model_and_auto_defaults_key_are_different_questions():
    assert capture_model(KIMI) == "deepseek" and capture_model(KIMI_WRAPPED) == "kimi_k25"
    assert capture_model(LLAMA) == capture_model({"architectures": ["Qwen3ForCausalLM"]}) == "llama"
    # the auto tree defaults read architectures[0] as written: the wrapper names itself
    assert auto_defaults_key(KIMI_WRAPPED) == "KimiK25ForConditionalGeneration"
    assert auto_defaults_key(None) == "Unknown"


def test_fix_ids_come_from_the_engine_rule():
    assert serving_ids(layout("L3+L31+L59"), LLAMA) == [2, 30, 58]
    assert serving_ids(layout("L2+L30+L58"), KIMI_WRAPPED) == [2, 30, 58]
    assert serving_ids(layout("L1+L3+L5"), KIMI) == [3, 5, 1]        # id 1 moved last: no +1 shift
    assert serving_ids(layout("L3+final+L5"), LLAMA) is None


def test_ids_the_engine_cannot_capture_are_a_typed_serving_error():
    err = try_serving_plan(drafter([2, 30, 70]), LLAMA)
    assert isinstance(err, ServingError) and err.field == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert "cannot capture" in str(err)


def test_eagle3_llama_family_shifts_ids():
    plan = serving_plan(drafter([2, 30, 58]), LLAMA)
    assert (plan.mode, str(plan.layout), plan.convention) == ("eagle3", "L3+L31+L59", "sglang-llama")
    assert plan.uses_fc and plan.lm_head == "drafter" and plan.uses_d2t and plan.crash is None


@pytest.mark.parametrize("ids", [[2, 30, 58], [1, 29, 57], None])
def test_eagle3_kimi_reads_l2_l30_l58(ids):
    plan = serving_plan(drafter(ids), KIMI_WRAPPED)
    assert str(plan.layout) == "L2+L30+L58"
    assert plan.engine == "sglang-0.5.23" and "SGLang 0.5.14–0.5.23" in plan.rule


def test_top_level_ids_are_ignored_and_defaults_apply():
    plan = serving_plan(drafter(top=[2, 30, 58]), LLAMA)
    assert str(plan.layout) == "L2+L30+L58"  # default, not L3+L31+L59
    assert any("ignored" in n for n in plan.notes)
    assert top_level_ids(drafter(top=[2, 30, 58])) == [2, 30, 58]
    assert nested_ids(drafter(top=[2, 30, 58])) is None


def test_nested_ids_win_over_differing_top_level():
    plan = serving_plan(drafter([2, 30, 58], top=[1, 2, 3]), LLAMA)
    assert str(plan.layout) == "L3+L31+L59"
    assert any("differs" in n for n in plan.notes)


@pytest.mark.parametrize("algorithm", ["EAGLE", "NEXTN", "eagle"])
def test_eagle_misconfiguration(algorithm):
    plan = serving_plan(drafter([2, 30, 58]), KIMI, algorithm=algorithm)
    assert plan.mode == "eagle" and str(plan.layout) == "final"
    assert not plan.uses_fc and plan.lm_head == "target" and not plan.uses_d2t
    assert plan.crash is None


def test_eagle_with_width_mismatch_crashes():
    plan = serving_plan(drafter([2, 30, 58], hidden=4096), KIMI, algorithm="EAGLE")
    assert plan.crash is not None and "7168" in plan.crash and "4096" in plan.crash


def test_null_draft_vocab_uses_target_head_and_a_missing_key_cannot_be_built():
    """"draft_vocab_size": null -> load_lm_head_from_target; no key at all -> the Llama
    EAGLE-3 class raises AttributeError while it is built, under either algorithm."""
    cfg = {**drafter([2, 30, 58]), "draft_vocab_size": None}
    assert serving_plan(cfg, LLAMA).lm_head == "target"
    del cfg["draft_vocab_size"]
    for algorithm in ("EAGLE3", "EAGLE"):
        with pytest.raises(DiagError, match="no draft_vocab_size key") as err:
            serving_plan(cfg, LLAMA, algorithm=algorithm)
        assert err.value.field == "draft_vocab_size"


def test_no_d2t_in_checkpoint():
    assert not serving_plan(drafter([2, 30, 58]), LLAMA, has_d2t=False).uses_d2t


@pytest.mark.parametrize("bad", [{"algorithm": "MEDUSA"}, {"engine_name": "sglang-0.4"}])
def test_unknown_algorithm_or_engine(bad):
    with pytest.raises(DiagError):
        serving_plan(drafter([2, 30, 58]), LLAMA, **bad)


def test_mode_aliases():
    assert [mode_of(a) for a in ("EAGLE3", "EAGLE", "NEXTN")] == ["eagle3", "eagle", "eagle"]


def test_bad_ids_type():
    with pytest.raises(DiagError):
        serving_plan(drafter("2,30,58"), LLAMA)


def test_declared_layouts_diag_key_first_then_specforge_ids():
    cfg = drafter([2, 30], diag_trained_layout="embed+L3+L31")
    got = [(str(d.layout), d.source) for d in declared_layouts(cfg, 61)]
    assert got == [("embed+L3+L31", "diag_trained_layout"),
                   ("L3+L31", "eagle_config.eagle_aux_hidden_state_layer_ids")]


def test_declared_layouts_speculators_reading():
    cfg = {"speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": [0, 3, 31]}
    got = [(str(d.layout), d.source) for d in declared_layouts(cfg, 61)]
    assert got == [("embed+L3+L31", "eagle_aux_hidden_state_layer_ids")]


def test_declared_layouts_checks_range():
    with pytest.raises(DiagError):
        declared_layouts({"diag_trained_layout": "embed+L70"}, 61)
