"""vLLM's OpenAI-compatible `/v1/completions`: the request diag sends, the record it saves, and
the checks on its /metrics scrape.

Request (one prompt per request, vllm/entrypoints/openai/completion/protocol.py):
  {"model": "<served name>", "prompt": [ids] | "<prompt>", "max_tokens": N, "temperature": 0.0,
   "stream": false}
Greedy is temperature 0; a sampled decoding adds top_p and top_k (diag's -1, all tokens, is
vLLM's 0: "top_k must be 0 (disable), or at least 1"). Every value is sent, so the server's
--generation-config defaults never decide.
Response: {"id": "cmpl-...", "model": ..., "choices": [{"index": 0, "text": ..., "finish_reason":
"length"}], "usage": {"prompt_tokens": P, "completion_tokens": C, ...}}.
Saved record: the response with "id" -> the prompt id, vLLM's own id kept as "vllm_id", and
"prompt" (its text). vLLM's per-request answer carries no speculative counts; the counters
live in /metrics (diag.engines.vllm.metrics), which `check_metrics` reads after the probe.
This module knows vLLM's JSON; it sends nothing itself.
"""

from __future__ import annotations

from diag.engines.decoding import Decoding
from diag.engines.vllm.metrics import VllmSpecCounters, read_vllm_metrics
from diag.errors import DiagError
from diag.probe.plan import ProbePrompt
from diag.probe.prometheus import label_values


def request(p: ProbePrompt, dec: Decoding, max_new_tokens: int, model: str) -> dict:
    """Greedy, ids [1, 9, 4], 64 tokens -> {"model": m, "prompt": [1, 9, 4], "max_tokens": 64,
    "temperature": 0.0, "stream": false}."""
    body = {"model": model, "prompt": list(p.ids) if p.ids is not None else p.text, "max_tokens": max_new_tokens,
            "stream": False}
    if dec.greedy:
        return {**body, "temperature": 0.0}
    return {**body, "temperature": dec.temperature, "top_p": dec.top_p, "top_k": max(dec.top_k, 0)}


def record(p: ProbePrompt, answer, url: str) -> dict:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not (isinstance(choices, list) and len(choices) == 1 and isinstance(usage, dict)
            and isinstance(usage.get("completion_tokens"), int)):
        raise DiagError("the server's answer is not a /v1/completions response", file=url, field=f"prompt {p.id}",
                        expected='{"choices": [one choice], "usage": {"completion_tokens": ...}}',
                        found=repr(answer)[:160])
    out = {"id": p.id, "vllm_id": answer.get("id")}
    if p.text is not None:
        out["prompt"] = p.text
    return {**out, **{k: v for k, v in answer.items() if k not in ("id", "prompt")}}


def served_model(models_answer, given: str | None, url: str) -> str:
    """The request's `model`: --model when given (it must be served), else the one served model."""
    data = models_answer.get("data") if isinstance(models_answer, dict) else None
    ids = [m["id"] for m in data or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if given is not None and given not in ids:
        raise DiagError("the server does not serve the model named", file=url, field="--model",
                        expected=f"one of {ids}", found=given)
    if given is None and len(ids) != 1:
        raise DiagError("the server serves several models (or none); name one", file=url, field="--model",
                        expected="--model NAME", found=ids)
    return given or ids[0]


def check_model_labels(text: str, model: str | None, url: str, prefix: str) -> None:
    """Every `model_name` label on the engine's samples names the model probed; a scrape from
    another model (a proxy, a second server on the port) is refused."""
    if model is None:
        return
    others = sorted(label_values(text, "model_name", prefix) - {model})
    if others:
        raise DiagError("the /metrics scrape is from another model", file=url, field='model_name="..."',
                        expected=f'model_name="{model}" (the model the probe sent to)', found=others,
                        hint="scrape the server that answered the requests (one model per server)")


def check_metrics(delta_text: str, source: str) -> VllmSpecCounters:
    """The probe's own counters: present, with drafts (else the server did not speculate)."""
    try:
        return read_vllm_metrics(delta_text, source=source)
    except DiagError as err:
        raise DiagError(f"the probe's vLLM counters are unusable: {err.message}", file=source, field=err.field,
                        expected=err.expected, found=err.found,
                        hint="was the server launched with --speculative-config (an EAGLE-3 drafter)?") from None
