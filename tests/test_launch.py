"""Launch-line parsing and SGLang 0.5.23's effective speculative settings."""

import argparse
import json

import pytest

from diag.cli import effective as effective_cmd
from diag.errors import DiagError
from diag.engines.sglang.launch import effective_config, parse_launch, server_argv

KIMI_WRAPPED = {"architectures": ["KimiK25ForConditionalGeneration"]}
DSV3 = {"architectures": ["DeepseekV3ForCausalLM"]}
LLAMA = {"architectures": ["LlamaForCausalLM"]}

SEED = ("python -m sglang.launch_server --model-path /m/kimi --speculative-algorithm EAGLE3 "
        "--speculative-draft-model-path /m/draft --speculative-num-steps 1 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 16 --tp 8 --trust-remote-code")


def test_parse_seed_line():
    f = parse_launch(SEED)
    assert (f.program, f.model_path, f.draft_model_path, f.algorithm) == (
        "sglang.launch_server", "/m/kimi", "/m/draft", "EAGLE3")
    assert (f.num_steps, f.topk, f.num_draft_tokens, f.tp_size) == (1, 1, 16, 8)
    assert f.max_running_requests is None
    assert ("--trust-remote-code", None) in f.other


def test_parse_sglang_serve_equals_form_and_continuations():
    line = ("CUDA_VISIBLE_DEVICES=0,1 sglang serve --model=/m/t \\\n"
            "  --speculative-algorithm=NEXTN --speculative-num-steps=3 --max-running-requests=64")
    f = parse_launch(line)
    assert (f.program, f.model_path, f.algorithm, f.num_steps, f.max_running_requests) == (
        "sglang serve", "/m/t", "NEXTN", 3, 64)


def test_parse_argv_list_and_last_value_wins():
    f = parse_launch(["python3", "-m", "sglang.launch_server", "--tp", "2", "--tp-size", "4"])
    assert f.tp_size == 4
    assert server_argv("python -m sglang.launch_server --tp 8") == ["--tp", "8"]


@pytest.mark.parametrize("line", [
    "python -m vllm.entrypoints.openai.api_server --model m",
    "python -m sglang.launch_server --speculative-num-steps three",
    "python -m sglang.launch_server stray --tp 1",
    "python -m sglang.launch_server --model-path",
    "python -m sglang.launch_server --model-path 'unclosed",
])
def test_parse_errors(line):
    with pytest.raises(DiagError):
        parse_launch(line)


def test_topk1_rewrite_seed_drafts_one_token():
    eff = effective_config(parse_launch(SEED), KIMI_WRAPPED)
    shape = eff.tree.shape
    assert (shape.num_steps, shape.topk, shape.num_draft_tokens) == (1, 1, 2)
    assert eff.crash is None
    assert any("forces num_draft_tokens" in n for n in eff.notes)
    assert eff.max_running_requests == 48


def test_auto_defaults_follow_architectures_0():
    base = "python -m sglang.launch_server --model-path m --speculative-algorithm EAGLE3"
    assert effective_config(parse_launch(base), DSV3).tree.shape.name == "chain-3"
    llama = effective_config(parse_launch(base), LLAMA).tree.shape
    assert (llama.num_steps, llama.topk, llama.num_draft_tokens) == (5, 4, 8)
    # the Kimi-K2.5 multimodal wrapper is not in SGLang's DeepSeek list
    assert effective_config(parse_launch(base), KIMI_WRAPPED).architecture == "KimiK25ForConditionalGeneration"
    unknown = effective_config(parse_launch(base), None)
    assert any("target config unknown" in n for n in unknown.notes)


def test_partial_flags_crash():
    line = "python -m sglang.launch_server --speculative-algorithm EAGLE3 --speculative-eagle-topk 4"
    eff = effective_config(parse_launch(line), LLAMA)
    assert eff.crash is not None and "AssertionError" in eff.crash


def test_too_many_draft_tokens_crash():
    line = ("python -m sglang.launch_server --speculative-algorithm EAGLE3 "
            "--speculative-num-steps 2 --speculative-eagle-topk 2 --speculative-num-draft-tokens 8")
    eff = effective_config(parse_launch(line), LLAMA)  # candidates 2 + 1*4 = 6 < 7
    assert eff.crash is not None and "out of range" in eff.crash


def test_nextn_alias_and_explicit_max_running():
    line = ("python -m sglang.launch_server --speculative-algorithm NEXTN "
            "--max-running-requests 256")
    eff = effective_config(parse_launch(line), DSV3)
    assert eff.algorithm == "EAGLE" and eff.max_running_requests == 256
    assert any("alias" in n for n in eff.notes)


def test_dp_attention_splits_request_slots():
    line = ("python -m sglang.launch_server --speculative-algorithm EAGLE3 --dp 8 "
            "--enable-dp-attention")
    eff = effective_config(parse_launch(line), DSV3)
    assert any("48 // 8 = 6" in n for n in eff.notes)


def test_no_speculation():
    eff = effective_config(parse_launch("python -m sglang.launch_server --model-path m"), LLAMA)
    assert eff.algorithm is None and eff.tree is None and eff.max_running_requests is None


def _cli(words):
    parser = argparse.ArgumentParser()
    effective_cmd.register(parser.add_subparsers())
    return parser.parse_args(["effective", *words])


def test_effective_command_prints_rewrite(capsys):
    args = _cli(["--", *SEED.split()])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "chain-1" in out and "max_running_requests: 48" in out


def test_effective_command_exit_1_on_crash(capsys, tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    line = (f"python -m sglang.launch_server --model-path {tmp_path} "
            "--speculative-algorithm EAGLE3 --speculative-num-steps 3")
    args = _cli(["--json", "--", line])
    assert args.func(args) == 1
    assert "TypeError" in json.loads(capsys.readouterr().out)["crash"]
