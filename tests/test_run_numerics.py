"""`diag run` computes the target and the drafter as the served engine rounds them
(inputs.engine_numerics): a vLLM case on CPU in bf16 runs vLLM-CPU's kernels
(target/engine_numerics.py, "fp32-kernels"), an SGLang case runs the model as loaded, and its
pass-cache key is the one it had before (the reports of SGLang cases do not move). Where the
engine's rounding cannot be followed (GPUs, a decoder apply_numerics does not know) the report
says so."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from diag.run.case import read_case, with_engine
from diag.run.inputs import engine_numerics, numerics_notes, prepare
from diag.run.target_passes import _Target, pass_key

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo():
    """The demo case's inputs (llama-tiny + llama-tiny-eagle3-embed-vllm-ids), 4 prompts, bf16."""
    case = read_case(ROOT / "cases" / "demo.toml")
    case = replace(case, target=replace(case.target, dtype="bfloat16"), drafter=replace(case.drafter, dtype="bfloat16"))
    inp = prepare(case)
    return replace(inp, prompts=inp.prompts[:4])


def _served(inp, name, gpus=0, arch=None):
    case = with_engine(inp.case, name)
    case = replace(case, placement=replace(case.placement, gpus=gpus))
    cfg = inp.target_config if arch is None else {**inp.target_config, "architectures": [arch]}
    return replace(inp, case=case, target_config=cfg)


def test_which_rounding_each_served_case_gets(demo):
    vllm, sglang = _served(demo, "vllm-0.32.0"), _served(demo, "sglang-0.5.23")
    assert (engine_numerics(vllm), numerics_notes(vllm)) == ("fp32-kernels", [])
    assert (engine_numerics(sglang), numerics_notes(sglang)) == ("transformers", [])
    on_gpus = _served(demo, "vllm-0.32.0", gpus=1)
    assert engine_numerics(on_gpus) == "transformers"
    assert "CPU kernels" in numerics_notes(on_gpus)[0] and "vllm-0.32.0" in numerics_notes(on_gpus)[0]
    moe = _served(demo, "vllm-0.32.0", arch="DeepseekV3ForCausalLM")
    assert engine_numerics(moe) == "transformers"
    assert "not DeepseekV3ForCausalLM" in numerics_notes(moe)[0]


def _placement(inp, dtype) -> str:
    return dict(pass_key(inp, "as-loaded", "0" * 64, dtype).fields)["placement"]


def test_the_pass_key_names_the_engines_rounding_only_where_it_applies(demo):
    sglang, vllm = _served(demo, "sglang-0.5.23"), _served(demo, "vllm-0.32.0")
    assert _placement(sglang, torch.bfloat16) == "cpu"             # SGLang: the key it always had
    assert _placement(vllm, torch.bfloat16) == "cpu,numerics=fp32-kernels"
    assert _placement(vllm, torch.float32) == "cpu"                # fp32: the same numbers, the same entry
    assert pass_key(vllm, "as-loaded", "0" * 64, torch.bfloat16).digest != \
        pass_key(sglang, "as-loaded", "0" * 64, torch.bfloat16).digest


def test_a_vllm_cases_target_rounds_as_vllm_cpu(demo):
    """The loaded bf16 target under a vLLM case carries the engine's rounding; its last hidden
    state differs from the SGLang case's (transformers' rounding) somewhere in a 12-token prompt,
    both deterministic."""
    ids = torch.tensor([demo.prompts[0][2][:12]])
    outs = {}
    for name in ("vllm-0.32.0", "sglang-0.5.23"):
        model = _Target(_served(demo, name), "as-loaded", torch.bfloat16, {}).get()
        assert getattr(model, "diag_numerics", "transformers") == engine_numerics(_served(demo, name))
        with torch.no_grad():
            outs[name] = model(ids, output_hidden_states=True).hidden_states[-1]
    assert outs["vllm-0.32.0"].dtype == torch.bfloat16
    assert not torch.equal(outs["vllm-0.32.0"], outs["sglang-0.5.23"])
    assert (outs["vllm-0.32.0"].float() - outs["sglang-0.5.23"].float()).abs().max() < 0.5
