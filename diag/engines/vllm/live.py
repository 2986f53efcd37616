"""A live vLLM server as `diag probe` meets it: how it is recognised, the OpenAI-compatible
`/v1/completions` request diag sends, the record it saves, and the checks on its /metrics
scrape (the LiveServer of diag.engines.protocol).

Detection: GET /version answers {"version": "0.32.0"} (SGLang has no such route), GET /metrics
has samples named vllm:*, GET /v1/models lists the served model names (data[].id, the `model`
of a request). Worked example: /version {"version": "0.32.0+cpu"}, vllm:* samples, /v1/models
{"data": [{"id": "llama-tiny"}]} -> Server("vllm", "0.32.0+cpu", "llama-tiny").

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
live in /metrics (metrics.py), whose difference over the probe is what `run --server-metrics`
reads (metrics_fields). Saved besides: models.json and version.json, as answered.
This module knows vLLM's JSON and routes; the HTTP is the probe's client.
"""

from __future__ import annotations

from diag.engines.common import json_object
from diag.engines.decoding import Decoding
from diag.engines.prometheus import names
from diag.engines.protocol import HttpClient, Server
from diag.engines.vllm.metrics import VllmSpecCounters, read_vllm_metrics
from diag.errors import DiagError


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


def check_metrics(delta_text: str, source: str) -> VllmSpecCounters:
    """The probe's own counters: present, with drafts (else the server did not speculate)."""
    try:
        return read_vllm_metrics(delta_text, source=source)
    except DiagError as err:
        raise DiagError(f"the probe's vLLM counters are unusable: {err.message}", file=source, field=err.field,
                        expected=err.expected, found=err.found,
                        hint="was the server launched with --speculative-config (an EAGLE-3 drafter)?") from None


class VllmLive:
    """vLLM's LiveServer (module docstring)."""

    family = "vllm"
    display = "vLLM"
    signature = "vLLM (GET /version and vllm:* samples in GET /metrics)"
    generate_path = "/v1/completions"
    rows_file = "completions.jsonl"
    run_flags = {"vllm_metrics": "--server-metrics"}   # ServerSpec field -> diag run flag
    requests_total = "vllm:request_success_total"

    def detect(self, client: HttpClient) -> Server | None:
        version = json_object(client.get("/version", ok_missing=True))
        if version is None or not isinstance(version.get("version"), str) or "internal_states" in version:
            return None
        metrics = client.get("/metrics", ok_missing=True)
        if metrics is None or not any(n.startswith("vllm:") for n in names(metrics.text)):
            return None
        models = json_object(client.get("/v1/models", ok_missing=True)) or {}
        ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
        return Server(self.family, version["version"], ids[0] if len(ids) == 1 else None, client.base)

    def served_model(self, client: HttpClient, server: Server, given: str | None) -> tuple[str | None, dict[str, str]]:
        models = client.get("/v1/models")
        return served_model(models.json(), given, client.base + "/v1/models"), {"models.json": models.text}

    def request(self, p, decoding: Decoding, max_new_tokens: int, model: str | None) -> dict:
        """Greedy, ids [1, 9, 4], 64 tokens -> {"model": m, "prompt": [1, 9, 4], "max_tokens": 64,
        "temperature": 0.0, "stream": false}."""
        body = {"model": model, "prompt": list(p.ids) if p.ids is not None else p.text,
                "max_tokens": max_new_tokens, "stream": False}
        if decoding.greedy:
            return {**body, "temperature": 0.0}
        return {**body, "temperature": decoding.temperature, "top_p": decoding.top_p,
                "top_k": max(decoding.top_k, 0)}

    def record(self, p, answer, url: str) -> dict:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        usage = answer.get("usage") if isinstance(answer, dict) else None
        if not (isinstance(choices, list) and len(choices) == 1 and isinstance(usage, dict)
                and isinstance(usage.get("completion_tokens"), int)):
            raise DiagError("the server's answer is not a /v1/completions response", file=url,
                            field=f"prompt {p.id}",
                            expected='{"choices": [one choice], "usage": {"completion_tokens": ...}}',
                            found=repr(answer)[:160])
        out = {"id": p.id, "vllm_id": answer.get("id")}
        if p.text is not None:
            out["prompt"] = p.text
        return {**out, **{k: v for k, v in answer.items() if k not in ("id", "prompt")}}

    def finish(self, client: HttpClient, server: Server, rows: list[dict]) -> tuple[dict, dict, list[str]]:
        """The completions carry no counts: nothing to check; version.json kept as answered."""
        return {"version.json": client.get("/version").text}, {}, []

    def metrics_fields(self, delta: str | None, source: str) -> tuple[dict[str, str], list[str]]:
        """The probe's counters are what run reads (--server-metrics): required, with drafts."""
        if delta is None:
            raise DiagError("the vLLM server has no /metrics", file=source,
                            expected="Prometheus text (vLLM serves it unless --disable-log-stats)", found="HTTP 404")
        check_metrics(delta, f"{source} (after - before this probe)")
        return {"vllm_metrics": "metrics.txt"}, []


LIVE = VllmLive()
