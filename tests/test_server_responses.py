"""/generate responses and /server_info bodies as each covered SGLang release writes them, vLLM's
/metrics, and the settings that make a server benchmark run at a chosen acceptance."""

import json

import pytest

from diag.engines.sglang.server_releases import server_release
from diag.engines.sglang.server_responses import read_generate_responses, read_server_info
from diag.engines import engine
from diag.engines.simulate import simulated_acceptance
from diag.engines.vllm.metrics import read_vllm_metrics
from diag.errors import DiagError
from diag.trees import TreeShape
from test_server_log import COVERED


def spec_meta(version: str, ct: int, acc: int, d: int, completion: int, hist: list[int]) -> dict:
    """meta_info's speculative keys as tokenizer_manager._calculate_spec_decoding_metrics sets them."""
    rel = server_release(version)
    meta = {"completion_tokens": completion}
    proposed = ct * (d - 1)
    if rel <= (0, 5, 10, 1):
        meta.update(spec_accept_rate=0.0, spec_accept_length=0, spec_verify_ct=ct)
        meta.update(spec_accept_rate=acc / proposed, spec_accept_length=completion / ct,
                    spec_accept_token_num=acc, spec_draft_token_num=proposed, spec_verify_ct=ct)
        if rel >= (0, 5, 9, 0):
            meta["spec_accept_histogram"] = hist
    elif rel == (0, 5, 11, 0):
        meta.update(spec_accept_rate=acc / proposed, spec_accept_length=completion / ct,
                    spec_accepted_drafts=acc, spec_proposed_drafts=proposed, spec_verify_ct=ct,
                    spec_accept_histogram=hist)
    else:
        meta.update(spec_accept_rate=acc / proposed, spec_accept_length=completion / ct,
                    spec_num_correct_drafts=acc, spec_num_proposed_drafts=proposed, spec_verify_ct=ct)
        if rel <= (0, 5, 20, 0):
            meta.update(spec_accepted_drafts=acc, spec_proposed_drafts=proposed)
        meta["spec_correct_drafts_histogram"] = hist
        if rel <= (0, 5, 20, 0):
            meta["spec_accept_histogram"] = hist
    return meta


def response(version: str, rid: str, ct: int, acc: int, d: int) -> dict:
    completion = 1 + acc + ct                    # prefill token + Σ(a+1)
    return {"text": "...", "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": completion},
                                         "prompt_tokens": 40, "cached_tokens": 0,
                                         **spec_meta(version, ct, acc, d, completion, [ct - acc, acc])}}


@pytest.mark.parametrize("version", COVERED)
def test_every_covered_release_reads_its_own_responses(version):
    lines = [json.dumps(response(version, "code-01", 38, 25, 2)), json.dumps(response(version, "code-02", 10, 0, 2))]
    got = read_generate_responses("\n".join(lines), source="r.jsonl", release=server_release(version))
    a, b = got.requests
    assert (a.id, a.rounds, a.accepted_sum, a.num_draft_tokens, a.completion_tokens) == ("code-01", 38, 25, 2, 64)
    assert a.accept_length == pytest.approx(1 + 25 / 38) and b.accept_length == 1.0


def test_batch_array_top_level_ids_and_zero_rounds():
    batch = [response("0.5.23", "x", 4, 4, 5), {**response("0.5.23", "sglang-rid", 3, 1, 5), "id": "code-07"}]
    zero = {"text": "a", "meta_info": {"id": "y", "completion_tokens": 1, "spec_verify_ct": 0}}
    got = read_generate_responses(json.dumps(batch + [zero]), source="r.json", release=server_release("0.5.23"))
    assert [r.id for r in got.requests] == ["x", "code-07", "y"]
    assert got.requests[0].num_draft_tokens == 5 and got.requests[2].accept_length is None


def test_responses_of_another_release_are_an_error():
    text = json.dumps(response("0.5.8", "a", 10, 5, 2))
    with pytest.raises(DiagError, match="not written by the declared SGLang release") as e:
        read_generate_responses(text, source="r.jsonl", release=server_release("0.5.23"))
    assert "0.5.6 - 0.5.10.post1" in str(e.value)
    mixed = "\n".join([json.dumps(response("0.5.8", "a", 10, 5, 2)), json.dumps(response("0.5.23", "b", 10, 5, 2))])
    with pytest.raises(DiagError, match="mixes SGLang releases"):
        read_generate_responses(mixed, source="r.jsonl", release=server_release("0.5.8"))


def test_bad_responses_are_errors():
    bad = [("not json\n", "not JSON"), (json.dumps({"text": "no meta"}), "not a /generate response"),
           (json.dumps({"text": "", "meta_info": {"id": "a", "completion_tokens": 5}}), "speculative count"),
           (json.dumps({"meta_info": {"id": "a", "completion_tokens": 5, "spec_verify_ct": 2,
                                      "spec_num_correct_drafts": 3, "spec_num_proposed_drafts": 3}}), "do not add up"),
           ("\n".join([json.dumps(response("0.5.23", "a", 3, 1, 2))] * 2), "same request id")]
    for text, match in bad:
        with pytest.raises(DiagError, match=match):
            read_generate_responses(text, source="r.jsonl", release=server_release("0.5.23"))


def test_server_info_flat_0_5_6_and_nested_0_5_23():
    flat = {"model_path": "/m", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 1,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2, "max_running_requests": 48,
            "internal_states": [{"last_gen_throughput": 56.8, "avg_spec_accept_length": 1.68}], "version": "0.5.6"}
    info = read_server_info(json.dumps(flat), source="info.json")
    assert (info.version, info.accept_length, info.tree, info.max_running_requests) == ("0.5.6", 1.68, (1, 1, 2), 48)
    nested = {"spec": {"speculative_num_steps": 3, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 5},
              "internal_states": [{"avg_spec_accept_length": 2.0}, {"avg_spec_accept_length": 2.4}],
              "version": "0.5.23"}
    info = read_server_info(json.dumps(nested), source="info.json")
    assert info.tree == (3, 4, 5) and info.accept_length == pytest.approx(2.2) and info.ranks == 2
    with pytest.raises(DiagError, match="no speculative accept length"):
        read_server_info(json.dumps({"internal_states": [{}], "version": "0.5.23"}), source="info.json")


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="kimi"} 600.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="kimi"} 400.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="kimi"} 1.7e9
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="kimi"} 3000.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="kimi"} 1200.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="kimi",position="0"} 600.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="kimi",position="1"} 400.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="kimi",position="2"} 200.0
"""


def test_vllm_counters_sum_over_engines():
    c = read_vllm_metrics(METRICS, source="metrics.txt")
    assert (c.num_drafts, c.num_speculative_tokens, c.accept_length) == (1000, 3, pytest.approx(2.2))
    assert c.acceptance_at_depth == (0.6, 0.4, 0.2)
    with pytest.raises(DiagError, match="no vLLM speculative-decoding counters"):
        read_vllm_metrics("vllm:num_requests_running 3\n", source="metrics.txt")
    with pytest.raises(DiagError, match="do not add up"):
        read_vllm_metrics(METRICS.replace("1200.0", "1300.0"), source="metrics.txt")


def test_simulated_acceptance_settings():
    sim = simulated_acceptance(2.4712, (0.8, 0.45, 0.5), TreeShape(3, 4, 8), engine("sglang-0.5.8")).to_json()
    assert sim["sglang_command_prefix"] == "SGLANG_SIMULATE_ACC_LEN=2.47 SGLANG_SIMULATE_ACC_METHOD=match-expected"
    assert sim["vllm_speculative_config"]["synthetic_acceptance_rates"] == [0.8, 0.45, 0.45]
    assert sim["vllm_speculative_config"]["num_speculative_tokens"] == 3
    assert any("multinomial" in n for n in sim["notes"])
    assert simulated_acceptance(9.0, (1.0,), TreeShape(1, 1, 2), engine("sglang-0.5.23")).accept_length == 2.0
