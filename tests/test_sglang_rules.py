"""diag's versioned engine rules against SGLang's own code, every known version.

Run from each wheel (tests/sglang_wheels.py): `set_eagle3_layers_to_capture` of llama.py,
deepseek_v2.py and kimi_k25.py (with the capture site of the model's forward: the
`hidden_states + residual` statement, run at layer 0, raises where the embeddings cannot
be captured); `auto_choose_speculative_params` / `_auto_choose_speculative_params`; the
topk=1 rewrite (the `if` statement itself); the decode log's accept-rate arithmetic; the
`use_aux_hidden_state` read; llama_eagle3's fc sizing and kimi_k25_eagle3's; llama.py's
`set_embed`. Read (not run), where the code needs a GPU process: the CUDA-graph capture
order, the draft worker's embed/head swap and the draft logits' vocabulary.
"""

from __future__ import annotations

import ast
import re
import types
from functools import lru_cache
from types import SimpleNamespace as NS

import pytest
import torch

import sglang_wheels as wheels
from diag.engines.sglang.accept_rate import formula_for
from diag.engines.sglang.capture import graph_replays_capture_defaults
from diag.engines.sglang.draft_tables import draft_tables
from diag.engines.sglang.drafter_keys import draft_vocab_crash, fc_inputs, uses_aux_hidden_state
from diag.engines.sglang.serving import ServingError, try_serving_plan
from diag.engines.sglang.tree_rules import auto_defaults, topk1_draft_tokens
from diag.engines.sglang.versions import RELEASES
from diag.metrics import AcceptCounts, accept_length, bonus_accept_rate, draft_accept_rate

pytestmark = pytest.mark.sglang

MODELS = {"llama": ("srt/models/llama.py", "LlamaForCausalLM", "LlamaModel"),
          "deepseek": ("srt/models/deepseek_v2.py", "DeepseekV2ForCausalLM", "DeepseekV2Model")}
TARGETS = {
    "llama": lambda n: {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": n, "hidden_size": 64},
    "deepseek": lambda n: {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                           "num_hidden_layers": n, "hidden_size": 64},
    "kimi_k25": lambda n: {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                           "text_config": {"model_type": "kimi_k2", "num_hidden_layers": n,
                                           "hidden_size": 64}},
}
IDS = [(61, None), (61, [2, 30, 58]), (61, [1, 29, 57]), (61, [0, 3, 31]), (61, [-1, 2, 30]),
       (61, [30, 2, 58]), (61, [0, 1, 2]), (61, [1, 2, 3]), (61, [2, 30, 60]), (61, [58, 59, 60]),
       (61, [3, 1, 2]), (8, [1, 3, 5]), (8, [0, 2, 4]), (8, [-1, 1, 3]), (8, [5, 6, 7]), (8, None)]


@pytest.fixture(scope="module", autouse=True)
def _wheels():
    wheels.fetch_all(RELEASES)


def drafter(ids=None, **extra) -> dict:
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "draft_vocab_size": 100,
           "vocab_size": 1000, **extra}
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    return cfg


# ---- capture ------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _capture_method(version: str, rel: str, cls: str):
    ns = wheels.load(version, rel, [f"{cls}.set_eagle3_layers_to_capture"])
    return ns["set_eagle3_layers_to_capture"]


def _fake_model(n: int) -> NS:
    return NS(pp_group=NS(is_last_rank=True), config=NS(num_hidden_layers=n),
              model=NS(layers_to_capture=[]), capture_aux_hidden_states=False)


def sglang_layers_to_capture(version: str, model: str, ids, n: int) -> list[int] | str:
    """What the version's set_eagle3_layers_to_capture sets, or why it cannot run."""
    if model == "kimi_k25":
        rel = "srt/models/kimi_k25.py"
        if not wheels.has(version, rel):
            return "no model class"
        if wheels.definition_source(version, rel, "KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture") is None:
            return "no capture method"
        inner = _fake_model(n)
        inner.set_eagle3_layers_to_capture = types.MethodType(_capture_method(version, *MODELS["deepseek"][:2]), inner)
        _capture_method(version, rel, "KimiK25ForConditionalGeneration")(NS(language_model=inner), ids)
        return list(inner.model.layers_to_capture)
    fake = _fake_model(n)
    _capture_method(version, *MODELS[model][:2])(fake, ids)
    assert fake.capture_aux_hidden_states is True
    return list(fake.model.layers_to_capture)


@lru_cache(maxsize=None)
def captures_embeddings(version: str, model: str) -> bool:
    """Whether the forward's capture site can take layer 0's input. The old site is the
    statement `if i in self.layers_to_capture: ... append(hidden_states + residual)`: run it at
    layer 0 (residual None) and it raises; the newer sites capture in the layer boundary /
    communicator, which keep the embeddings as the residual."""
    rel, _, model_cls = MODELS["deepseek" if model == "kimi_k25" else model]
    node = wheels.statement(version, rel, ast.If, "if i in self.layers_to_capture", "hidden_states + residual")
    forward = wheels.definition_source(version, rel, f"{model_cls}.forward")
    if node is None or wheels.segment(version, rel, node) not in forward:
        assert "capture_output=" in forward or "captured_last_layer_outputs=" in forward
        return True
    env = {"self": NS(layers_to_capture=[0, 1], enable_a2a_moe=False, first_k_dense_replace=0),
           "aux_hidden_states": [], "hidden_states": torch.ones(2), "get_attention_tp_group": None,
           "tensor_model_parallel_all_gather": None}
    wheels.run_statements(version, rel, [node], {**env, "i": 1, "residual": torch.ones(2)})
    with pytest.raises(TypeError):
        wheels.run_statements(version, rel, [node], {**env, "i": 0, "residual": None})
    return False


def sglang_layout(version: str, model: str, ids, n: int) -> list[int] | None:
    """Residual indices SGLang concatenates, or None when it crashes (uncapturable index:
    TypeError at layer 0, or a layer never reached so fc gets fewer states)."""
    layers = sglang_layers_to_capture(version, model, ids, n)
    if isinstance(layers, str):
        return None
    lo = 0 if captures_embeddings(version, model) else 1
    if 0 in layers and lo == 1:
        return None
    captured = [r for r in range(n) if r in layers]
    return captured if len(captured) == len(layers) else None


def _diag_indices(plan) -> list[int] | None:
    if isinstance(plan, ServingError):
        return None
    return [p.index for p in plan.layout.points]


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("model", ["llama", "deepseek", "kimi_k25"])
def test_capture_rule_matches_sglang(version, model):
    for n, ids in IDS:
        want = sglang_layout(version, model, ids, n)
        plan = try_serving_plan(drafter(ids), TARGETS[model](n), engine_name=version, cuda_graph=False)
        assert _diag_indices(plan) == want, (version, model, n, ids, plan)


@pytest.mark.parametrize("version", RELEASES)
def test_kimi_wrapper_errors_say_why(version):
    plan = try_serving_plan(drafter([2, 30, 58]), TARGETS["kimi_k25"](61), engine_name=version)
    got = sglang_layers_to_capture(version, "kimi_k25", [2, 30, 58], 61)
    if got == "no model class":
        assert isinstance(plan, ServingError) and "no KimiK25ForConditionalGeneration" in plan.message
    elif got == "no capture method":
        assert isinstance(plan, ServingError) and "no set_eagle3_layers_to_capture" in plan.message
    else:
        assert not isinstance(plan, ServingError)


@pytest.mark.parametrize("version", RELEASES)
def test_kimi_vl_has_no_capture_method(version):
    rel = "srt/models/kimi_vl.py"
    method = wheels.definition_source(version, rel, "KimiVLForConditionalGeneration.set_eagle3_layers_to_capture")
    assert wheels.has(version, rel) and method is None
    target = {"architectures": ["KimiVLForConditionalGeneration"], "model_type": "kimi_vl",
              "text_config": {"num_hidden_layers": 27, "hidden_size": 64}}
    assert isinstance(try_serving_plan(drafter([2, 13, 24]), target, engine_name=version), ServingError)


@pytest.mark.parametrize("version", RELEASES)
def test_cuda_graph_capture_order(version):
    """Up to 0.5.10.post1 the graph runner sets the default layers before capturing, and the
    model runner sets the ids only after init_device_graphs (read, not run: it needs CUDA)."""
    runners = [f"srt/model_executor/{r}" for r in ("cuda_graph_runner.py", "runner/base_cuda_graph_runner.py",
                                                   "runner/decode_cuda_graph_runner.py")]
    found = [wheels.path(version, r).read_text() for r in runners if wheels.has(version, r)]
    assert found
    resets = any("set_eagle3_layers_to_capture()" in text for text in found)
    assert resets == graph_replays_capture_defaults(version)
    if resets:
        init = wheels.definition_source(version, "srt/model_executor/model_runner.py", "ModelRunner.initialize")
        assert init.index("self.init_device_graphs()") < init.index("set_eagle3_layers_to_capture(")
        default = try_serving_plan(drafter([0, 3, 31]), TARGETS["llama"](61), engine_name=version)
        assert str(default.layout) == "L2+L30+L58" and str(default.prefill_layout) == "L1+L4+L32"


# ---- tree flags ---------------------------------------------------------------------------

ARCHS = ["LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM", "DeepseekV3ForCausalLM",
         "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
         "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM", "Glm4MoeForCausalLM",
         "Glm4MoeLiteForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration",
         "MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM", "BailingMoeV2ForCausalLM",
         "BailingMoeV2_5ForCausalLM", "GlmMoeDsaForCausalLM", "Mystery"]


def sglang_auto_params(version: str):
    """The version's auto-params function as f(architecture, algorithm) -> (S, K, D)."""
    if wheels.definition_source(version, "srt/arg_groups/speculative_hook.py", "_auto_choose_speculative_params"):
        fn = wheels.load(version, "srt/arg_groups/speculative_hook.py", ["_auto_choose_speculative_params"],
                         {"resolving_view": lambda x: x})["_auto_choose_speculative_params"]
        return lambda arch, algo: fn(NS(speculative_algorithm=algo), arch)
    fn = wheels.load(version, "srt/server_args.py", ["auto_choose_speculative_params"])["auto_choose_speculative_params"]
    return lambda arch, algo: fn(NS(speculative_algorithm=algo,
                                    get_hf_config=lambda: NS(architectures=[arch]),
                                    get_model_config=lambda: NS(hf_config=NS(architectures=[arch]))))


@pytest.mark.parametrize("version", RELEASES)
def test_auto_tree_defaults_match_sglang(version):
    theirs = sglang_auto_params(version)
    for arch in ARCHS:
        for algo in ("EAGLE3", "EAGLE", "STANDALONE"):
            assert auto_defaults(arch, version, algo)[0] == tuple(theirs(arch, algo)), (version, arch, algo)


def sglang_topk1_rewrite(version: str):
    rel = next(r for r in ("srt/arg_groups/speculative_hook.py", "srt/server_args.py")
               if wheels.statement(version, r, ast.If, "speculative_eagle_topk == 1", "speculative_num_steps + 1"))
    node = wheels.statement(version, rel, ast.If, "speculative_eagle_topk == 1", "speculative_num_steps + 1")

    def run(s, k, d):
        args = NS(speculative_num_steps=s, speculative_eagle_topk=k, speculative_num_draft_tokens=d)
        env = {"self": args, "cfg": args, "server_args": args, "logger": NS(warning=lambda *a, **kw: None),
               "declare_resolution": lambda target, where, **kw: [setattr(target, key, v) for key, v in kw.items()]}
        wheels.run_statements(version, rel, [node], env)
        return args.speculative_num_draft_tokens
    return run


@pytest.mark.parametrize("version", RELEASES)
def test_topk1_rewrite_matches_sglang(version):
    theirs = sglang_topk1_rewrite(version)
    for s in (1, 2, 3, 5):
        for k in (1, 2, 4):
            for d in (None, 2, 4, 8, 16):
                assert topk1_draft_tokens(s, k, d) == theirs(s, k, d), (version, s, k, d)
    assert theirs(1, 1, 16) == 2          # the seed: 16 draft tokens asked, 1 drafted


# ---- the decode log ------------------------------------------------------------------------

METRICS_FILES = ("srt/managers/scheduler_components/metrics_reporter.py",
                 "srt/observability/scheduler_metrics_mixin.py", "srt/managers/scheduler_metrics_mixin.py")


def sglang_accept_numbers(version: str, counts: AcceptCounts) -> tuple[float, float]:
    """Run the decode log's `else:` branch up to `spec_accept_rate = ...`."""
    for rel in METRICS_FILES:
        node = wheels.statement(version, rel, ast.If, "spec_algorithm.is_none()", "spec_accept_rate =",
                                "spec_accept_length")
        if node is not None:
            break
    stop = next(i for i, st in enumerate(node.orelse) if isinstance(st, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "spec_accept_rate" for t in st.targets))
    a_sum = sum(i * n for i, n in enumerate(counts.accepted_hist))
    sa = NS(speculative_num_draft_tokens=counts.num_draft_tokens, speculative_num_steps=counts.num_steps)
    me = NS(spec_num_accepted_tokens=a_sum + counts.rounds, spec_num_accept_tokens=a_sum + counts.rounds,
            spec_num_forward_ct=counts.rounds, spec_num_correct_drafts=a_sum, server_args=sa,
            scheduler=NS(server_args=sa))
    env = wheels.run_statements(version, rel, node.orelse[:stop + 1], {"self": me, "get_spec": lambda: sa})
    return env["spec_accept_length"], env["spec_accept_rate"]


@pytest.mark.parametrize("version", RELEASES)
def test_logged_accept_rate_formula_matches_sglang(version):
    pick = {"sglang_accept_rate": draft_accept_rate, "sglang_accept_rate_legacy": bonus_accept_rate}
    for a, s, d in [([1, 0, 2, 1], 3, 4), ([1] * 84 + [0] * 16, 1, 2), ([3, 3, 0, 2, 5], 5, 8)]:
        c = AcceptCounts.from_accepted(a, s, d)
        length, rate = sglang_accept_numbers(version, c)
        assert length == pytest.approx(accept_length(c))
        assert rate == pytest.approx(pick[formula_for(version)](c)), version


# ---- drafter config keys, tables -------------------------------------------------------------

AUX_FILES = ("srt/model_executor/model_runner_components/spec_aux_hidden_state.py",
             "srt/model_executor/model_runner.py")


def sglang_use_aux(version: str, eagle_config) -> bool | None:
    """Run the `try:` that reads eagle_config (None: this version never reads the key)."""
    for rel in AUX_FILES:
        node = wheels.statement(version, rel, ast.Try, '"use_aux_hidden_state"', "eagle_aux_hidden_state_layer_ids")
        if node is not None:
            break
    else:
        return None
    state = NS(eagle_use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=None)
    hf = NS(eagle_config=eagle_config) if eagle_config is not None else NS()
    wheels.run_statements(version, rel, [node], {"self": state, "config": state,
                                                 "draft_model_config": NS(hf_config=hf)})
    return state.eagle_use_aux_hidden_state


@pytest.mark.parametrize("version", RELEASES)
def test_use_aux_hidden_state_matches_sglang(version):
    for eagle in ({"use_aux_hidden_state": False, "eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
                  {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
                  {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}, None):
        cfg = drafter() if eagle is None else {**drafter(), "eagle_config": eagle}
        theirs = sglang_use_aux(version, eagle)
        assert uses_aux_hidden_state(cfg, version)[0] == (True if theirs is None else theirs), (version, eagle)
    cfg = {**drafter(), "use_aux_hidden_state": False}         # top level: never read
    assert uses_aux_hidden_state(cfg, version)[0] is True


def sglang_fc_inputs(version: str, cfg: dict) -> int:
    """llama_eagle3.LlamaModel.__init__'s num_aux resolution, run; 3 where it has none."""
    rel = "srt/models/llama_eagle3.py"
    assign = wheels.statement(version, rel, ast.Assign, "self.num_aux_hidden_states = getattr(config")
    if assign is None:
        assert "self.hidden_size_in * 3" in wheels.definition_source(version, rel, "LlamaModel.__init__")
        return 3
    check = wheels.statement(version, rel, ast.If, "if self.num_aux_hidden_states is None")
    me = NS()
    wheels.run_statements(version, rel, [assign, check], {"self": me, "config": NS(**cfg)})
    return me.num_aux_hidden_states


def sglang_mla_fc_inputs(version: str, cfg: dict) -> int | None:
    rel = "srt/models/kimi_k25_eagle3.py"
    if wheels.definition_source(version, rel, "_get_eagle_aux_layer_count") is None:
        return None
    fn = wheels.load(version, rel, ["_get_eagle_aux_layer_count"], {"PretrainedConfig": object})
    return fn["_get_eagle_aux_layer_count"](NS(**cfg))


@pytest.mark.parametrize("version", RELEASES)
def test_fc_sizing_matches_sglang(version):
    configs = [drafter([1, 2, 3]), drafter([1, 2]), drafter(None), drafter(None, num_aux_hidden_states=2),
               drafter([1, 2, 3], num_aux_hidden_states=4), drafter(None, eagle_aux_hidden_state_layer_ids=[5, 6])]
    for cfg in configs:
        assert fc_inputs(cfg, version)[0] == sglang_fc_inputs(version, cfg), (version, cfg)
        mla = {**cfg, "architectures": ["Eagle3DeepseekV2ForCausalLM"]}
        theirs = sglang_mla_fc_inputs(version, mla)
        if theirs is not None:
            assert fc_inputs(mla, version)[0] == theirs, (version, mla)


def sglang_builds_head(version: str, cfg: dict, rel: str = "srt/models/llama_eagle3.py") -> bool | str:
    """The head block of the drafter's __init__ (tied / untied, draft_vocab_size None ->
    load_lm_head_from_target) and the draft logits' `config_.vocab_size = ...` statement, run
    on a namespace holding exactly the drafter config.json's keys: what the transformers config
    SGLang builds from it holds (an absent key is an absent attribute: LlamaConfig() has no
    draft_vocab_size, checked here). Returns load_lm_head_from_target, or the AttributeError's
    text."""
    from transformers import LlamaConfig
    assert not hasattr(LlamaConfig(), "draft_vocab_size")
    block = wheels.statement(version, rel, ast.If, "if self.config.tie_word_embeddings", "draft_vocab_size")
    if block is None:
        block = wheels.statement(version, rel, ast.If, "if config.tie_word_embeddings", "draft_vocab_size")
    logits = "config_for_logits" if "config_for_logits" in wheels.path(version, rel).read_text() else "config_"
    flag = wheels.statement(version, rel, ast.Assign, "self.load_lm_head_from_target = False")
    pre = wheels.statement(version, rel, ast.Assign, "draft_vocab_size = getattr(config")
    copy_ = wheels.statement(version, rel, ast.Assign, f"{logits} = copy.deepcopy(config)")
    vocab = wheels.statement(version, rel, ast.Assign, f"{logits}.vocab_size =")
    config = NS(**cfg)
    me = NS(config=config, model=NS(embed_tokens=object()))
    env = {"self": me, "config": config, "quant_config": None, "prefix": "", "add_prefix": lambda *a: "",
           "ParallelLMHead": lambda *a, **k: ("head", a), "copy": __import__("copy")}
    assert flag is not None and block is not None and copy_ is not None and vocab is not None, version
    nodes = [n for n in (flag, pre, block, copy_, vocab) if n is not None]
    try:
        wheels.run_statements(version, rel, nodes, env)
    except AttributeError as err:
        return str(err)
    return me.load_lm_head_from_target


@pytest.mark.parametrize("version", RELEASES)
def test_missing_draft_vocab_size_matches_sglang(version):
    """LlamaForCausalLMEagle3 reads config.draft_vocab_size without a default: no key ->
    AttributeError while the drafter is built (tied or not); null -> the target's lm_head;
    a number -> its own head. Eagle3DeepseekV2ForCausalLM (since 0.5.12) reads it with
    getattr: no key = null. diag's draft_vocab_crash says the same."""
    base = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "vocab_size": 1000,
            "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128}
    for tie in (False, True):
        for extra, crashes, from_target in (({}, True, None), ({"draft_vocab_size": None}, False, True),
                                            ({"draft_vocab_size": 100}, False, False)):
            cfg = {**base, "tie_word_embeddings": tie, **extra}
            got = sglang_builds_head(version, cfg)
            assert isinstance(got, str) == crashes, (version, cfg, got)
            if crashes:
                assert "draft_vocab_size" in got
            elif not tie:
                assert got is from_target, (version, cfg)
            assert (draft_vocab_crash(cfg, version) is not None) == crashes, (version, cfg)
    mla_rel = "srt/models/kimi_k25_eagle3.py"
    if wheels.has(version, mla_rel) and wheels.statement(version, mla_rel, ast.Assign,
                                                         "draft_vocab_size = getattr(config"):
        mla = {**base, "architectures": ["Eagle3DeepseekV2ForCausalLM"], "tie_word_embeddings": False}
        assert sglang_builds_head(version, mla, mla_rel) is True
        assert draft_vocab_crash(mla, version) is None
    plan = try_serving_plan({**base, "tie_word_embeddings": False}, TARGETS["llama"](8), engine_name=version)
    assert isinstance(plan, ServingError) and "no draft_vocab_size key" in plan.message


def sglang_set_embed_keeps_own(version: str, **config) -> bool:
    fake_torch = NS(cuda=NS(empty_cache=lambda: None, synchronize=lambda: None),
                    xpu=NS(empty_cache=lambda: None, synchronize=lambda: None))
    ns = wheels.load(version, "srt/models/llama.py", ["LlamaForCausalLM.set_embed"],
                     {"torch": fake_torch, "_is_xpu": False,
                      "current_platform": NS(empty_cache=lambda: None, synchronize=lambda: None)})
    own, target = object(), object()
    me = NS(config=NS(**config), model=NS(embed_tokens=NS(weight=own)))
    ns["set_embed"](me, target)
    return me.model.embed_tokens.weight is own


@pytest.mark.parametrize("version", RELEASES)
def test_embedding_table_matches_sglang(version):
    for extra in ({}, {"target_hidden_size": 64}, {"target_hidden_size": 128}):
        keeps = sglang_set_embed_keeps_own(version, hidden_size=64, **extra)
        t = draft_tables("eagle3", hidden_size=64, target_hidden_size=extra.get("target_hidden_size"),
                         draft_vocab_size=100, vocab_size=1000)
        assert (t.embed == "drafter") == keeps, (version, extra)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("version", RELEASES)
def test_draft_worker_tables_read(version):
    """The embed/head swap and the draft logits' vocabulary (read: they run in a GPU worker)."""
    eagle3 = _squash(wheels.path(version, "srt/models/llama_eagle3.py").read_text())
    assert "config_.vocab_size=(config_.draft_vocab_size)" in eagle3 or \
        "config_.vocab_size=config_.draft_vocab_size" in eagle3
    assert "ifconfig.draft_vocab_size isNone:self.load_lm_head_from_target=True".replace(" ", "") in eagle3
    worker = "".join(_squash(wheels.path(version, f"srt/speculative/{w}").read_text())
                     for w in ("eagle_worker.py", "eagle_worker_v2.py") if wheels.has(version, f"srt/speculative/{w}"))
    assert "load_lm_head_from_target):" in worker and ".set_embed(embed)" in worker
    assert ".set_embed_and_head(embed,head)" in worker
    t = draft_tables("eagle", hidden_size=64, target_hidden_size=None, draft_vocab_size=100, vocab_size=1000)
    assert (t.embed, t.lm_head, t.vocab_limit) == ("target", "target", 100)
