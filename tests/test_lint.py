"""diag lint on tiny config.json + safetensors checkpoints built in tmp_path."""

import argparse
import json

import pytest
import torch
from safetensors.torch import save_file

from diag.cli import lint as lint_cmd
from diag.engines.sglang.launch import effective_config, parse_launch
from diag.checks.lint import lint, read_tensor_headers
from diag.engines.sglang.cross_check import compare_with_sglang

N, H_T, H, VOCAB, DRAFT_VOCAB = 8, 32, 32, 100, 40


def write_target(path, **over):
    cfg = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": N, "hidden_size": H_T,
           "vocab_size": VOCAB, "rope_theta": 10000.0, "max_position_embeddings": 2048, **over}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def _module_weights(hidden, k, draft_vocab):
    """Every weight of the LlamaForCausalLMEagle3 module these widths imply (zeros)."""
    from diag.drafter.model import DrafterConfig, Eagle3Drafter
    cfg = DrafterConfig(hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        vocab_size=VOCAB, draft_vocab_size=draft_vocab, target_hidden_size=H_T, num_aux=k)
    with torch.device("meta"):
        shapes = {n: t.shape for n, t in Eagle3Drafter(cfg).state_dict().items() if n not in ("d2t", "t2d")}
    return {n: torch.zeros(shape) for n, shape in shapes.items()}


def write_drafter(path, *, k=3, hidden=H, draft_vocab=DRAFT_VOCAB, tensors=None, drop=(),
                  **over):
    """A LlamaForCausalLMEagle3-format drafter: config.json + model.safetensors
    with fc [H, k*H_T], lm_head [draft_vocab, H], d2t int64, t2d bool."""
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": hidden,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
           "vocab_size": VOCAB, "draft_vocab_size": draft_vocab, "rope_theta": 10000.0,
           "rope_scaling": None, "max_position_embeddings": 2048,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5]}, **over}
    weights = {**_module_weights(hidden, k, draft_vocab),
               "d2t": torch.zeros(draft_vocab, dtype=torch.int64),
               "t2d": torch.zeros(VOCAB, dtype=torch.bool), **(tensors or {})}
    for name in drop:
        weights.pop(name)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(weights, str(path / "model.safetensors"))
    return path


def launch(algo="EAGLE3", steps=3, topk=1, tokens=4, extra=" --max-running-requests 64"):
    return (f"python -m sglang.launch_server --model-path t --speculative-algorithm {algo} "
            f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} "
            f"--speculative-num-draft-tokens {tokens}{extra}")


def codes(findings, severity=None):
    return {f.code for f in findings if severity is None or f.severity == severity}


@pytest.fixture
def pair(tmp_path):
    return write_drafter(tmp_path / "d"), write_target(tmp_path / "t")


def test_clean_pair_has_no_errors_or_warnings(pair):
    found = lint(*pair, launch())
    assert codes(found, "error") == set() and codes(found, "warning") == set()
    assert "SGLANG_UNAVAILABLE" in codes(found, "info")


def test_headers_only(pair):
    heads = read_tensor_headers(pair[0])
    assert heads["fc.weight"].shape == (H, 3 * H_T) and heads["d2t"].dtype == "I64"


def test_seed1_eagle_algorithm(pair):
    found = [f for f in lint(*pair, launch(algo="EAGLE")) if f.code == "EAGLE_ALGORITHM"]
    assert len(found) == 1 and found[0].severity == "error"
    assert "32 wide instead of 3x32 = 96" in found[0].behaviour
    assert "EAGLE3" in found[0].fix
    assert "EAGLE_ALGORITHM" in codes(lint(*pair, launch(algo="NEXTN")))


def test_seed2_layout_mismatch(tmp_path):
    # nested ids [2, 5, 6] -> sglang-llama serves L3+L6+L7; trained on embed+L3+L6
    d = write_drafter(tmp_path / "d", eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 5, 6]},
                      diag_trained_layout="embed+L3+L6")
    found = [f for f in lint(d, write_target(tmp_path / "t"), launch())
             if f.code == "LAYOUT_MISMATCH"]
    assert len(found) == 1 and found[0].severity == "error"
    assert "embed+L3+L6" in found[0].message and "L3+L6+L7" in found[0].message
    assert "[-1, 2, 5]" in found[0].fix


def test_seed3_topk1_rewrite(pair):
    found = [f for f in lint(*pair, launch(steps=1, topk=1, tokens=16)) if f.code == "TREE_REWRITE"]
    assert len(found) == 1 and found[0].severity == "warning"
    assert "16" in found[0].message and "chain-1" in found[0].behaviour


def test_tree_crash_and_max_running(pair):
    found = lint(*pair, launch(steps=2, topk=2, tokens=8, extra=""))
    assert {"TREE_CRASH", "MAX_RUNNING_REQUESTS"} <= codes(found)


def test_fc_width_mismatch(tmp_path):
    d = write_drafter(tmp_path / "d", k=2)
    assert "FC_WIDTH" in codes(lint(d, write_target(tmp_path / "t"), launch()), "error")


def test_top_level_ids_ignored(tmp_path):
    d = write_drafter(tmp_path / "d", eagle_config={}, eagle_aux_hidden_state_layer_ids=[1, 3, 5])
    found = [f for f in lint(d, write_target(tmp_path / "t"), None) if f.code == "TOP_LEVEL_IDS"]
    # defaults for N=8: L2+L4+L5; top-level ids would give L2+L4+L6
    assert found[0].severity == "error" and "L2+L4+L5" in found[0].behaviour


def test_deepseek_first_id(tmp_path):
    t = write_target(tmp_path / "t", architectures=["DeepseekV3ForCausalLM"])
    d = write_drafter(tmp_path / "d", eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5]})
    found = [f for f in lint(d, t, None) if f.code == "DEEPSEEK_FIRST_ID"]
    assert found[0].severity == "warning" and "L2+L4+L5" in found[0].message
    assert "L3+L5+L6" in found[0].message
    d1 = write_drafter(tmp_path / "d1")  # [1, 3, 5]: shifted, same as SpecForge's reading
    assert [f.severity for f in lint(d1, t, None) if f.code == "DEEPSEEK_FIRST_ID"] == ["info"]


def test_vocab_checks(tmp_path):
    t = write_target(tmp_path / "t")
    d = write_drafter(tmp_path / "d", tensors={"d2t": torch.zeros(39, dtype=torch.int64),
                                                "t2d": torch.zeros(99, dtype=torch.bool)})
    shapes = [f for f in lint(d, t, None) if f.code == "VOCAB_SHAPE"]
    assert {f.field for f in shapes} == {"d2t", "t2d"}
    missing = write_drafter(tmp_path / "m", drop=("d2t",))
    assert "D2T_MISSING" in codes(lint(missing, t, None), "error")
    other_vocab = write_target(tmp_path / "t2", vocab_size=101)
    assert "TARGET_VOCAB" in codes(lint(d, other_vocab, None), "error")


def test_hidden_checks(tmp_path):
    t = write_target(tmp_path / "t", hidden_size=48)
    d = write_drafter(tmp_path / "d")  # fc built for 3 x 32, target is 48 wide
    found = codes(lint(d, t, None), "error")
    assert {"HIDDEN_SIZE", "FC_WIDTH"} <= found
    d2 = write_drafter(tmp_path / "d2", target_hidden_size=64)
    assert "TARGET_HIDDEN_SIZE" in codes(lint(d2, t, None), "error")


def test_rope_checks(tmp_path):
    t = write_target(tmp_path / "t", rope_theta=50000.0, max_position_embeddings=8192,
                     rope_scaling={"type": "yarn", "factor": 4.0})
    found = codes(lint(write_drafter(tmp_path / "d"), t, None), "warning")
    assert {"ROPE_THETA", "ROPE_SCALING", "MAX_POSITIONS"} <= found


def test_bad_ids_become_a_finding(tmp_path):
    d = write_drafter(tmp_path / "d", eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 9]})
    assert "CONFIG" in codes(lint(d, write_target(tmp_path / "t"), None), "error")


def test_compare_with_sglang():
    eff = effective_config(parse_launch(launch(steps=1, topk=1, tokens=16)), None)
    same = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 1,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2,
            "max_running_requests": 64}
    assert compare_with_sglang(eff, same) == []
    diff = compare_with_sglang(eff, {**same, "speculative_num_draft_tokens": 16})
    assert [f.flag for f in diff] == ["speculative_num_draft_tokens"]


def _cli(words):
    parser = argparse.ArgumentParser()
    lint_cmd.register(parser.add_subparsers())
    return parser.parse_args(["lint", *words])


def test_cli_exit_codes(pair, capsys):
    d, t = pair
    ok = _cli(["--drafter", str(d), "--target", str(t), "--launch", launch()])
    assert ok.func(ok) == 0
    bad = _cli(["--drafter", str(d), "--target", str(t), "--launch", launch(algo="EAGLE")])
    assert bad.func(bad) == 1
    assert "ERROR EAGLE_ALGORITHM" in capsys.readouterr().out
    missing = _cli(["--drafter", str(d / "nope"), "--target", str(t)])
    assert missing.func(missing) == 2


def test_layout_checked_as_eagle3_even_under_eagle(tmp_path):
    d = write_drafter(tmp_path / "d", eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 5, 6]},
                      diag_trained_layout="embed+L3+L6")
    found = [f for f in lint(d, write_target(tmp_path / "t"), launch(algo="EAGLE"))
             if f.code == "LAYOUT_MISMATCH"]
    assert "once launched with EAGLE3" in found[0].message
