"""The conformance suite: every published config in tests/fixtures/real-configs, as diag meets it.

Targets and drafters are rebuilt at tiny widths with the same structure (conformance.py) and
loaded; the real configs themselves, alone in a folder as users have them before a 550 GB
download, are linted at their real widths, and lint's statements about what SGLang 0.5.23
serves are checked against DESIGN.md §2/§5. Two pairs run end to end.
"""

import json

import pytest
import torch

from conformance import REAL, build_drafter, build_target, config_only, real
from diag.checks.lint import lint
from diag.cli.main import main
from diag.drafter.checkpoint import inspect_drafter, load_drafter
from diag.engines.sglang.serving import try_serving_plan
from diag.errors import DiagError
from diag.int4.packed import PackedExperts
from diag.layouts import layout
from diag.run.inputs import check_pair
from diag.target.capture import capture_pass
from diag.target.load import load_target, target_info

DRAFTERS = sorted(p.name for p in REAL.iterdir() if p.is_dir() and p.name.startswith(("specforge", "torchspec")))
# name -> (target, format, architecture, attention, trainer, variant, lm_head)
DETECTED = {
    "specforge-deepseek-r1-671b-eagle3": ("deepseek-v3", "sglang-eagle3", "LlamaForCausalLMEagle3", "llama",
                                          "unknown", "eagle3", "drafter"),
    "specforge-deepseek-v2-lite-eagle3": (None, "sglang-eagle3", "LlamaForCausalLMEagle3", "llama", "unknown",
                                          "eagle3", "drafter"),
    "specforge-deepseek-v3-671b-eagle3": ("deepseek-v3", "sglang-eagle3", "LlamaForCausalLMEagle3", "llama",
                                          "unknown", "eagle3", "drafter"),
    "specforge-deepseek-v3-671b-eagle3-c02a09a": ("deepseek-v3", "sglang-eagle3", "LlamaForCausalLMEagle3",
                                                  "llama", "unknown", "eagle3", "drafter"),
    "specforge-kimi-k2-eagle3": ("kimi-k2-instruct", "sglang-eagle3", "LlamaForCausalLMEagle3", "llama",
                                 "unknown", "eagle3", "drafter"),
    "specforge-kimi-k25-eagle3": ("kimi-k2.5", "sglang-eagle3", "LlamaForCausalLMEagle3", "llama", "unknown",
                                  "eagle3", "drafter"),
    "specforge-llama3-8B-eagle3": ("llama-3.1-8b-instruct", "sglang-eagle3", "LlamaForCausalLMEagle3", "llama",
                                   "unknown", "eagle3", "drafter"),
    "specforge-qwen3-30B-A3B-eagle3.1": ("qwen3-30b-a3b", "sglang-eagle3", "LlamaForCausalLMEagle3", "llama",
                                         "unknown", "eagle3.1", "drafter"),
    "specforge-qwen3-8b-eagle3": ("qwen3-8b", "sglang-eagle3", "LlamaForCausalLMEagle3", "llama", "unknown",
                                  "eagle3", "drafter"),
    "torchspec-kimi-k25-eagle3": ("kimi-k2.5", "sglang-eagle3", "LlamaForCausalLMEagle3", "llama", "unknown",
                                  "eagle3", "target"),
    "torchspec-kimi-k25-eagle3-mla": ("kimi-k2.5", "sglang-eagle3", "Eagle3DeepseekV2ForCausalLM", "mla",
                                      "torchspec", "eagle3", "drafter"),
    "torchspec-qwen3-8b-eagle3": ("qwen3-8b", "sglang-eagle3", "LlamaForCausalLMEagle3", "llama", "unknown",
                                  "eagle3", "drafter"),
    "torchspec-qwen3-8b-eagle3-mla": ("qwen3-8b", "sglang-eagle3", "Eagle3DeepseekV2ForCausalLM", "mla",
                                      "unknown", "eagle3", "target"),
}
TARGETS = ("kimi-k2.5", "kimi-k2.5-rawstyle", "llama-3.1-8b-instruct", "qwen3-8b", "qwen3-30b-a3b")
LOADABLE_TARGETS = {"kimi-k2-instruct": None, "deepseek-v3": None}     # FP8: refused (below)


def test_the_corpus_is_covered():
    names = {p.name for p in REAL.iterdir() if p.is_dir()}
    assert names == set(DETECTED) | set(TARGETS) | set(LOADABLE_TARGETS) | {"specforge-kimi-k2-nextn-ba1d65d2"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("conformance")
    cache: dict[str, object] = {}

    def get(name: str, **kw):
        key = name + json.dumps(kw, sort_keys=True)
        if key not in cache:
            folder = root / f"{name}-{len(cache)}"
            cache[key] = build_target(name, folder) if name in TARGETS else build_drafter(name, folder, **kw)
        return cache[key]
    return get


# ---- targets ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["kimi-k2.5", "kimi-k2.5-rawstyle"])
def test_kimi_k25_int4_wrapper_loads_text_only(tiny, name):
    """Text weights under language_model., quantization_config at the top and in text_config
    with a plain "lm_head" ignore entry; the raw file's kimi_k2 model_type and rope_scaling yarn."""
    path = tiny(name)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["quantization_config"] == cfg["text_config"]["quantization_config"]
    assert "lm_head" in cfg["quantization_config"]["ignore"]
    info = target_info(path)
    assert (info.architecture, info.quantization, info.num_layers) == ("KimiK25ForConditionalGeneration",
                                                                       "pack-quantized", 6)
    model, _ = load_target(path)
    assert isinstance(model.model.layers[1].mlp.experts, PackedExperts)
    assert isinstance(model.lm_head, torch.nn.Linear)                    # ignored by "lm_head"
    assert model.config.rope_parameters["rope_type"] == "yarn" and model.config.rope_parameters["factor"] == 64
    assert any("text model only" in n for n in model.diag_load_notes)
    assert any("model_type 'kimi_k2' built as" in n for n in model.diag_load_notes) == (name == "kimi-k2.5-rawstyle")
    cap = capture_pass(model, torch.tensor([[1, 5, 9, 2]]), torch.ones(1, 4, dtype=torch.long),
                       layout("embed+L3+L6").points)
    assert cap.states["L6"].shape == (1, 4, 64) and torch.isfinite(cap.states["L6"].float()).all()


@pytest.mark.parametrize("name", sorted(LOADABLE_TARGETS))
def test_fp8_targets_are_refused_from_the_config(tmp_path, name):
    """DeepSeek-V3 and Kimi-K2-Instruct ship block FP8 (quant_method fp8): a clear error from
    config.json alone, before any weight."""
    with pytest.raises(DiagError, match="unsupported quantization") as err:
        target_info(config_only(name, tmp_path / name))
    assert err.value.field == "quantization_config.quant_method" and "'fp8'" in err.value.found
    assert err.value.file.endswith("config.json")


@pytest.mark.parametrize("name", ["llama-3.1-8b-instruct", "qwen3-8b", "qwen3-30b-a3b"])
def test_dense_and_qwen3_targets_load_and_capture(tiny, name):
    path = tiny(name)
    model, info = load_target(path)
    assert info.architecture == real(name)["architectures"][0] and info.quantization is None
    cap = capture_pass(model, torch.tensor([[3, 1, 4, 1, 5]]), torch.ones(1, 5, dtype=torch.long),
                       layout("embed+L1+L6").points)
    assert set(cap.states) >= {"embed", "L1", "L6"} and cap.argmax.shape == (1, 5)


# ---- drafters --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DETECTED))
def test_every_published_drafter_loads_and_is_recognised(tiny, name):
    target, fmt, arch, attention, trainer, variant, lm_head = DETECTED[name]
    model, ckpt = load_drafter(tiny(name))
    f = ckpt.format
    assert (f.format, f.architecture, f.attention, f.trainer, f.variant, f.options.lm_head) == \
        (fmt, arch, attention, trainer, variant, lm_head)
    assert f.options.embed_tokens is True and model.embed_tokens is not None      # shipped, kept
    assert (model.lm_head is None) == (lm_head == "target")
    if name == "specforge-qwen3-30B-A3B-eagle3.1":
        assert f.options.fc_norm and f.options.norm_output and model.cfg.fc_norm
    if target in TARGETS:
        check_pair(target_info(tiny(target)), ckpt)                             # vocab and width agree


def test_mtp_head_is_not_an_eagle3_drafter(tiny):
    with pytest.raises(DiagError, match="not an EAGLE-3 drafter") as err:
        inspect_drafter(tiny("specforge-kimi-k2-nextn-ba1d65d2"))
    assert err.value.field == "architectures" and "NEXTN" in err.value.hint


def test_llama_weights_in_an_mla_config_are_caught_from_the_headers(tiny, tmp_path):
    """The issue's Kimi story: an MLA drafter read as a Llama one failed hours in, on the
    target pass's far side. Now the headers say it before anything loads."""
    import shutil
    path = shutil.copytree(tiny("torchspec-kimi-k25-eagle3-mla"), tmp_path / "d")
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DiagError, match="missing a weight") as err:
        inspect_drafter(path)
    assert err.value.field == "midlayer.self_attn.q_proj.weight"
    found = lint(path, config_only("kimi-k2.5", tmp_path / "t"), None)
    assert any(x.severity == "error" and x.field == "midlayer.self_attn.q_proj.weight" for x in found)


# ---- lint on the real configs, config only -----------------------------------------------------

def _lint(tmp_path, drafter, target, launch=None, edit=None):
    return lint(config_only(drafter, tmp_path / "d", edit=edit), config_only(target, tmp_path / "t"), launch)


def _say(findings, code):
    return [f for f in findings if f.code == code]


@pytest.mark.parametrize("name", sorted(n for n, v in DETECTED.items() if v[0] in TARGETS + ("deepseek-v3",
                                                                                         "kimi-k2-instruct")))
def test_lint_works_on_config_only_directories(tmp_path, name):
    found = _lint(tmp_path, name, DETECTED[name][0])
    (note,) = _say(found, "NO_WEIGHTS")
    assert note.severity == "info" and "not checked" in note.message and "d2t" in note.message
    assert not _say(found, "D2T_MISSING") and not _say(found, "EMBED_MISSING")
    fmt = _say(found, "DRAFTER_FORMAT")[0].message
    assert DETECTED[name][2] in fmt and DETECTED[name][5] in fmt


@pytest.mark.parametrize("ids, served", [
    ([0, 3, 31], "embed+L3+L31"),                                       # id 0 = embed since 0.5.14
    ([2, 30, 58], "L2+L30+L58"), ([1, 29, 57], "L2+L30+L58")])
def test_lint_says_what_sglang_0_5_23_serves_for_kimi_k25(tmp_path, ids, served):
    """DESIGN.md §2: SGLang >= 0.5.13 on DeepSeek/Kimi targets: L{id+1} only if the first id is 1."""
    edit = lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=ids)  # noqa: E731
    found = _lint(tmp_path, "specforge-kimi-k25-eagle3", "kimi-k2.5", edit=edit)
    assert any(f"reads {ids} as {served}" in f.message for f in _say(found, "DEEPSEEK_FIRST_ID"))
    plan = try_serving_plan(real("specforge-kimi-k25-eagle3") | {"eagle_config": {
        "eagle_aux_hidden_state_layer_ids": ids}}, real("kimi-k2.5"))
    assert str(plan.layout) == served and plan.convention == "sglang-deepseek"


def test_torchspec_mla_kimi_drafter(tmp_path):
    """lightseekorg's kimi-k2.5-eagle3-mla training config: MLA, ids [1, 29, 57] in TorchSpec's
    eagle_config, its own full-vocabulary lm_head. The verdict follows what SGLang serves."""
    found = _lint(tmp_path, "torchspec-kimi-k25-eagle3-mla", "kimi-k2.5")
    assert "Eagle3DeepseekV2ForCausalLM" in _say(found, "DRAFTER_FORMAT")[0].message
    assert "mla attention" in _say(found, "DRAFTER_FORMAT")[0].message
    assert _say(found, "TORCHSPEC_IDS") and not _say(found, "LAYOUT_MISMATCH")
    assert not [f for f in found if f.severity == "error"]
    plan = try_serving_plan(real("torchspec-kimi-k25-eagle3-mla"), real("kimi-k2.5"))
    assert str(plan.layout) == "L2+L30+L58" and plan.lm_head == "drafter"


def test_torchspec_qwen3_mla_without_ids_or_draft_vocab(tmp_path):
    """No eagle_config: SGLang's default L2+L{N//2}+L{N-3} (N = 36 -> L2+L18+L33); no
    draft_vocab_size: the MLA drafter loads its lm_head from the target (kimi_k25_eagle3.py)."""
    plan = try_serving_plan(real("torchspec-qwen3-8b-eagle3-mla"), real("qwen3-8b"))
    assert str(plan.layout) == "L2+L18+L33" and plan.lm_head == "target"
    found = _lint(tmp_path, "torchspec-qwen3-8b-eagle3-mla", "qwen3-8b")
    assert "target's lm_head" in _say(found, "DRAFTER_FORMAT")[0].message


def test_llama_drafter_without_draft_vocab_size_on_sglang_0_5_23():
    """SGLang 0.5.23 llama_eagle3.py reads `config.draft_vocab_size` on a LlamaConfig (transformers
    5.19): without the key, building LlamaForCausalLMEagle3 raises AttributeError (only the MLA
    class uses getattr(..., None) and falls back to the target's lm_head)."""
    plan = try_serving_plan(real("torchspec-kimi-k25-eagle3"), real("kimi-k2.5"))
    assert not hasattr(plan, "layout") and "draft_vocab_size" in str(plan)


def test_lint_names_the_missing_draft_vocab_size_and_its_fix(tmp_path):
    """The published TorchSpec Kimi Llama drafter has no draft_vocab_size key: lint's error
    points at the key and proposes the key (a number or null), not a layout fix."""
    found = _lint(tmp_path, "torchspec-kimi-k25-eagle3", "kimi-k2.5")
    err = _say(found, "CONFIG")[0]
    assert err.severity == "error" and err.field == "draft_vocab_size" and "AttributeError" in err.message
    assert err.fix.startswith("set draft_vocab_size:") and "null" in err.fix
    assert "cannot build it" in _say(found, "DRAFTER_FORMAT")[0].message


def test_torchspec_llama_kimi_drafter_default_layout():
    plan = try_serving_plan(real("torchspec-kimi-k25-eagle3"), real("kimi-k2.5"))
    assert getattr(plan, "layout", None) is None or str(plan.layout) == "L2+L30+L58"


def test_kimi_k25_wrapper_gets_auto_tree_3_1_4(tmp_path):
    """DESIGN.md §5 and 0.5.23 speculative_hook._auto_choose_speculative_params: every
    architecture not listed (the KimiK25ForConditionalGeneration wrapper) gets (3, 1, 4)."""
    found = _lint(tmp_path, "specforge-kimi-k25-eagle3", "kimi-k2.5",
                  launch="python -m sglang.launch_server --model-path k --speculative-algorithm EAGLE3 "
                         "--max-running-requests 32")
    assert any("S=3, K=1, D=4" in f.behaviour for f in _say(found, "TREE_AUTO"))


def test_qwen3_and_llama_targets_use_the_llama_capture_rule(tmp_path):
    for drafter, target, served in (("specforge-qwen3-8b-eagle3", "qwen3-8b", "L2+L18+L33"),
                                    ("specforge-llama3-8B-eagle3", "llama-3.1-8b-instruct", "L2+L16+L29")):
        plan = try_serving_plan(real(drafter), real(target))
        assert str(plan.layout) == served and plan.convention == "sglang-llama"


def test_eagle31_options_are_reported(tmp_path):
    found = _lint(tmp_path, "specforge-qwen3-30B-A3B-eagle3.1", "qwen3-30b-a3b")
    msg = _say(found, "DRAFTER_FORMAT")[0].message
    assert "eagle3.1 (fc_norm, norm_output)" in msg


def test_speculators_config_reads_its_layer_config(tmp_path):
    """speculators' Eagle3SpeculatorConfig on a Qwen3-8B target: hidden_size and RoPE live in
    transformer_layer_config (no false ROPE_SCALING, no missing-key error); SGLang 0.5.23 has no
    class for it (its EAGLE-3 classes: LlamaForCausalLMEagle3, Eagle3DeepseekV2ForCausalLM)."""
    layer = {k: real("qwen3-8b")[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                               "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
                                               "rope_scaling", "max_position_embeddings", "vocab_size")}
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": 32000,
           "transformer_layer_config": {"model_type": "llama", "num_hidden_layers": 1, **layer},
           "eagle_aux_hidden_state_layer_ids": [2, 18, 33, 36], "norm_before_residual": True,
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                  "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]}}}
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    found = lint(d, config_only("qwen3-8b", tmp_path / "t"), None)
    assert not _say(found, "ROPE_SCALING") and not _say(found, "ROPE_THETA")
    assert [f.severity for f in _say(found, "UNSERVABLE_DRAFTER")] == ["error"]
    assert "speculators format" in _say(found, "DRAFTER_FORMAT")[0].message
    assert not [f for f in found if f.code == "CONFIG"]


# ---- end to end -------------------------------------------------------------------------------

@pytest.mark.parametrize("target, drafter, ids, trained, variant", [
    ("kimi-k2.5", "torchspec-kimi-k25-eagle3-mla", [1, 2, 3], "L2+L3+L4", "eagle3"),
    ("qwen3-30b-a3b", "specforge-qwen3-30B-A3B-eagle3.1", [1, 2, 3], "L2+L3+L4", "eagle3.1"),
])
def test_runs_end_to_end_and_reports_what_it_detected(tiny, tmp_path, monkeypatch, target, drafter, ids,
                                                      trained, variant):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"text": "the quick brown fox"}\n')
    out = tmp_path / "r"
    code = main(["run", "--target", str(tiny(target)), "--drafter", str(tiny(drafter, ids=ids)),
                 "--prompts", str(prompts), "--layout", trained, "--tree", "chain-2", "--tree", "s2-k2-d3",
                 "--max-new-tokens", "6", "--out", str(out), "--quiet"])
    assert code == 0
    rep = json.loads((out / "report.json").read_text())
    d = rep["drafter"]
    assert (d["architecture"], d["variant"]) == (DETECTED[drafter][2], variant)
    assert d["attention"] == DETECTED[drafter][3] and d["options"]["embed_tokens"] is True
    assert {e["tree"] for e in rep["evaluations"]} == {"chain-2", "s2-k2-d3"}
    assert rep["serving"]["error"] is None
    md = (out / "report.md").read_text()
    assert f"{d['attention']} attention; {variant}" in md


@pytest.mark.parametrize("version, servable", [("0.5.11", False), ("0.5.12", True), ("0.5.23", True)])
def test_mla_drafter_class_exists_from_sglang_0_5_12(tmp_path, version, servable):
    """srt/models/kimi_k25_eagle3.py (Eagle3DeepseekV2ForCausalLM) first ships in the 0.5.12 wheel."""
    found = lint(config_only("torchspec-kimi-k25-eagle3-mla", tmp_path / "d"), config_only("kimi-k2.5", tmp_path / "t"),
                 None, engine=f"sglang-{version}")
    bad = _say(found, "UNSERVABLE_DRAFTER")
    assert bool(bad) != servable
    if bad:
        assert "0.5.12" in bad[0].fix and bad[0].severity == "error"
