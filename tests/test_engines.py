"""The engine protocol (diag/engines/protocol.py) and its registry: a release is parsed into its
family, the SGLang package answers every question through SglangEngine with the rules its
modules hold, and the verification rules it names exist in diag.replay.verifiers."""

import inspect

import pytest
import torch

from diag.engines import DEFAULT_ENGINE, EngineRules, engine, families, family_rules, rules, split
from diag.engines.common import ServingError, ServingPlan, refused
from diag.engines.protocol import Release
from diag.errors import DiagError
from diag.layouts import layout
from diag.replay.verifiers import SAMPLED, greedy_rule, sampled_rule

LLAMA6 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 6,
          "hidden_size": 64, "vocab_size": 256}
KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168},
        "num_hidden_layers": 61, "hidden_size": 7168}


def test_a_release_name_is_parsed_into_its_family():
    assert engine("sglang-0.5.23") == Release("sglang", "0.5.23", "SGLang")
    assert engine("0.5.10.post1").name == "sglang-0.5.10.post1"          # a bare version: the first family
    assert engine(None).name == DEFAULT_ENGINE == f"sglang-{rules().releases()[-1]}"
    assert split("sglang-0.5.8") == ("sglang", "0.5.8") and families()[0] == "sglang"
    assert engine("0.5.10").release < engine("0.5.10.post1").release < engine("0.5.11").release
    with pytest.raises(DiagError, match="unknown serving engine version"):
        engine("sglang-0.5.99")


def test_every_family_implements_every_method_of_the_protocol():
    wanted = {n for n, v in vars(EngineRules).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert {"serving_plan", "fix_for", "resolve_tree", "verification", "flag_problems"} <= wanted
    for family in families():
        r = family_rules(family)
        assert isinstance(r, EngineRules) and r.family == family
        missing = [n for n in wanted if not callable(getattr(type(r), n, None))]
        assert not missing, f"{family} lacks {missing}"
        for name in wanted:            # the same parameters, by name, as the protocol declares
            want = list(inspect.signature(getattr(EngineRules, name)).parameters)
            got = list(inspect.signature(getattr(type(r), name)).parameters)
            assert got == want, (family, name, got, want)


def test_sglang_capture_and_the_fix_in_its_own_terms():
    r, rel = rules(), engine("sglang-0.5.23")
    assert r.serving_ids(layout("embed+L2+L4"), LLAMA6, release=rel) == [-1, 1, 3]
    assert r.fix_for(layout("embed+L2+L4"), LLAMA6, release=rel).text == (
        "write eagle_config.eagle_aux_hidden_state_layer_ids = [-1, 1, 3] (SGLang 0.5.23, sglang-llama)")
    assert r.capture_convention(KIMI, release=rel) == "sglang-deepseek"
    assert str(r.default_aux_layers(KIMI, release=rel)) == "L2+L30+L58"
    assert r.default_aux_layers(KIMI, release=engine("0.5.9")) is None        # no capture method on 0.5.9
    old = r.fix_for(layout("embed+L3+L31"), KIMI, release=engine("0.5.13"))
    assert old.ids is None and old.upgrade == ("0.5.14", [0, 3, 31])


def test_sglang_serving_plan_a_crash_and_an_impossible_config():
    r, rel = rules(), engine("sglang-0.5.23")
    drafter = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "vocab_size": 256,
               "draft_vocab_size": 256, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 1, 3]}}
    plan = r.serving_plan(drafter, LLAMA6, release=rel)
    assert isinstance(plan, ServingPlan) and str(plan.layout) == "embed+L2+L4" and plan.engine == rel.name
    assert refused(plan) is plan
    bad = r.serving_plan({**drafter, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 1, 3]}}, LLAMA6,
                         release=engine("0.5.21"))                          # id -1 is no embedding before 0.5.22
    assert isinstance(bad, ServingError) and "cannot capture" in bad.message
    eagle = r.serving_plan(drafter, LLAMA6, release=rel, algorithm="NEXTN")
    assert eagle.mode == "eagle" and r.mode_of("nextn") == "eagle" and r.algorithms()[0] == "EAGLE3"


def test_sglang_trees_verification_metrics_and_launch():
    r, rel = rules(), engine("sglang-0.5.23")
    assert r.resolve_tree(1, 1, 16, LLAMA6, release=rel).shape.name == "chain-1"
    assert r.resolve_tree(None, None, None, KIMI, release=engine("0.5.7")).shape.name == "s5-k4-d8"
    assert r.resolve_tree(None, None, None, KIMI, release=rel).shape.name == "chain-3"
    assert r.resolve_tree(3, 4, 100, LLAMA6, release=rel).crash is not None
    req = r.request_defaults({"temperature": 0.6, "top_p": 0.95, "min_p": 0.1}, release=rel)
    assert req.values == {"temperature": 0.6, "top_p": 0.95, "top_k": -1} and req.unmodelled == {"min_p": 0.1}
    assert r.request_defaults({"temperature": 0.6}, "openai", release=rel).source == "SGLang defaults"
    v = r.verification(rel)
    assert (v.greedy, v.sampled) == ("tree-argmax", "tree-target-only")
    assert r.accept_rate_formula(engine("0.5.10.post1")) == "sglang_accept_rate_legacy"
    assert r.accept_rate_formula(rel) == "sglang_accept_rate"
    assert r.formula_label("sglang_accept_rate") == "SGLang 0.5.11–0.5.23: Σa / (rounds·(D-1)), draft slots only"
    cmd = "python -m sglang.launch_server --model-path /m --speculative-algorithm EAGLE3 --speculative-num-step 2"
    assert r.launch_argv(cmd)[:2] == ["--model-path", "/m"]
    assert r.parse_launch(cmd, release=rel).num_steps == 2
    assert r.effective_config(r.parse_launch(cmd, release=rel), LLAMA6, release=rel).algorithm == "EAGLE3"
    codes = [p.code for p in r.flag_problems(r.launch_argv(cmd), release=rel)]
    assert codes == ["ABBREVIATED_FLAG"]
    near = r.flag_problems(["--speculative-algoritm", "EAGLE3"], release=engine("0.5.16"))
    assert [(p.code, p.parser) for p in near] == [("UNKNOWN_FLAG", "SGLang 0.5.14"), ("FLAG_TABLE", "SGLang 0.5.14")]
    with pytest.raises(DiagError, match="no SGLang /metrics"):
        r.read_metrics("vllm:spec_decode_num_drafts_total 1", source="m.txt")


def test_every_named_verification_rule_exists_and_an_unknown_one_is_refused():
    for family in families():
        r = family_rules(family)
        v = r.verification(r.release(r.releases()[-1]))
        assert sampled_rule(v.sampled) is SAMPLED[v.sampled] and callable(greedy_rule(v.greedy))
    with pytest.raises(DiagError, match="unknown sampled verification rule"):
        sampled_rule("coin-flip")


def _chain(B=4000):
    p_root, p_1, p_leaf = [0.1, 0.4, 0.3, 0.15, 0.05], [0.2, 0.1, 0.5, 0.1, 0.1], [0.2] * 5
    tokens = torch.tensor([[-1, 1, 2]]).expand(B, -1)
    parents = torch.tensor([[-1, 0, 1]]).expand(B, -1)
    probs = torch.tensor([[p_root, p_1, p_leaf]]).expand(B, -1, -1)
    return tokens, parents, torch.ones_like(tokens, dtype=torch.bool), probs


def test_the_two_sampled_rules_agree_in_law_on_a_chain_and_chain_rejection_refuses_a_tree():
    """P(a >= 1) = p_root(1) = .4, P(a >= 2) = .4 x p_1(2) = .2 under both rules."""
    t, p, v, probs = _chain()
    g = torch.Generator().manual_seed(3)
    coins, final = torch.rand(t.shape[0], 3, generator=g), torch.rand(t.shape[0], generator=g)
    for name in ("tree-target-only", "chain-rejection"):
        r = SAMPLED[name].verify(t, p, v, probs, coins, final, 2)
        got = [(r.accepted >= d).float().mean().item() for d in (1, 2)]
        assert got == pytest.approx([0.4, 0.2], abs=0.03), name
    tree_parents = torch.tensor([[-1, 0, 0]]).expand_as(p)
    with pytest.raises(DiagError, match="chains only"):
        SAMPLED["chain-rejection"].verify(t, tree_parents, v, probs, coins, final, 2)


def test_every_family_talks_to_a_live_server_through_the_protocol():
    """diag probe names no engine: each family's LiveServer implements every method, with the
    protocol's parameters, and says which family it is."""
    from diag.engines.protocol import LiveServer
    wanted = {n for n, v in vars(LiveServer).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert {"detect", "request", "record", "finish", "metrics_fields", "served_model"} <= wanted
    for family in families():
        live = family_rules(family).live_server()
        assert isinstance(live, LiveServer) and live.family == family
        assert live.requests_total.startswith(f"{family}:") and set(live.run_flags.values()) <= {
            "--server-responses", "--server-info", "--server-metrics"}
        for name in wanted:
            want = list(inspect.signature(getattr(LiveServer, name)).parameters)
            assert list(inspect.signature(getattr(type(live), name)).parameters) == want, (family, name)
