"""A live SGLang server as `diag probe` meets it: how it is recognised, the `/generate` request
diag sends and the record it saves (the LiveServer of diag.engines.protocol).

Detection: GET /server_info (0.5.x; older releases only /get_server_info) answers a JSON
object whose "internal_states" list (one entry per DP rank) marks SGLang, "version" the
release; GET /model_info (older: /get_model_info) the served_model_name. Worked example:
/server_info {"version": "0.5.23", "internal_states": [...]}, /model_info {"served_model_name":
"llama-tiny"} -> Server("sglang", "0.5.23", "llama-tiny").

Request (GenerateReqInput, srt/managers/io_struct.py of SGLang 0.5.23; one prompt, not a batch):
  {"rid": "<prompt id>", "input_ids": [ids] | "text": "<prompt>", "return_logprob": false,
   "stream": false, "sampling_params": {"max_new_tokens": N, "temperature": 0.0}}
Greedy is temperature 0 (SGLang then samples top_k = 1); a sampled decoding sends temperature,
top_p and top_k (-1: all tokens), each as diag evaluates it. Every value is sent, so the
server's request defaults (--sampling-defaults, generation_config.json) never decide.
Response: {"text": ..., "output_ids": [...], "meta_info": {"id": rid, "completion_tokens": ...,
"spec_verify_ct": ..., "spec_num_correct_drafts": ..., ...}} (tokenizer_manager.py).

Saved record (one JSON line per prompt, what server_responses reads): the response with a
top-level "id" (the prompt id) and "prompt" (its text), e.g.
  {"id": "code-01", "prompt": "def f(x): ...", "text": "...", "meta_info": {"id": "code-01", ...}}
Saved besides: server_info.json, GET /server_info after the probe (its avg_spec_accept_length is
the server's lifetime average; responses.jsonl holds the probe's own counts).
This module knows SGLang's JSON and routes; the HTTP is the probe's client.
"""

from __future__ import annotations

from diag.engines.common import find_key, json_object
from diag.engines.decoding import Decoding
from diag.engines.protocol import HttpClient, Server
from diag.errors import DiagError


def sampling_params(dec: Decoding, max_new_tokens: int) -> dict:
    """Greedy -> {"max_new_tokens": 64, "temperature": 0.0};
    t0.7-p0.9-k20 -> {..., "temperature": 0.7, "top_p": 0.9, "top_k": 20}."""
    if dec.greedy:
        return {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    return {"max_new_tokens": max_new_tokens, "temperature": dec.temperature, "top_p": dec.top_p,
            "top_k": dec.top_k}


class SglangLive:
    """SGLang's LiveServer (module docstring)."""

    family = "sglang"
    display = "SGLang"
    signature = "SGLang (GET /server_info with internal_states)"
    generate_path = "/generate"
    rows_file = "responses.jsonl"
    run_flags = {"responses": "--server-responses", "server_info": "--server-info"}   # ServerSpec field -> flag
    requests_total = "sglang:num_requests_total"

    def detect(self, client: HttpClient) -> Server | None:
        for path in ("/server_info", "/get_server_info"):
            reply = client.get(path, ok_missing=True)
            info = json_object(reply)
            if info is not None and isinstance(info.get("internal_states"), list):
                model = json_object(client.get("/model_info", ok_missing=True)) or \
                    json_object(client.get("/get_model_info", ok_missing=True)) or {}
                name = model.get("served_model_name") or find_key(info, "served_model_name") or \
                    model.get("model_path") or find_key(info, "model_path")
                version = info.get("version")
                return Server(self.family, version if isinstance(version, str) else None,
                              name if isinstance(name, str) else None, client.base, reply.text, path)
        return None

    def served_model(self, client: HttpClient, server: Server, given: str | None) -> tuple[str | None, dict[str, str]]:
        """/generate names no model: `given` must be the one detection found, where it found one."""
        if given is not None and server.model is not None and given != server.model:
            raise DiagError("the server does not serve the model named", file=server.url, field="--model",
                            expected=given, found=server.model)
        return given or server.model, {}

    def request(self, p, decoding: Decoding, max_new_tokens: int, model: str | None = None) -> dict:
        body = {"rid": p.id, "sampling_params": sampling_params(decoding, max_new_tokens), "return_logprob": False,
                "stream": False}
        if p.ids is not None:
            body["input_ids"] = list(p.ids)
        else:
            body["text"] = p.text
        return body

    def record(self, p, answer, url: str) -> dict:
        meta = answer.get("meta_info") if isinstance(answer, dict) else None
        if not isinstance(meta, dict):
            raise DiagError("the server's answer is not a /generate response", file=url, field=f"prompt {p.id}",
                            expected='{"text": ..., "meta_info": {...}}', found=repr(answer)[:160])
        if meta.get("id") not in (None, p.id):
            raise DiagError("the server answered with another request id", file=url, field=f"prompt {p.id}",
                            expected=f'meta_info.id "{p.id}" (the rid sent)', found=repr(meta.get("id")))
        out = {"id": p.id}
        if p.text is not None:
            out["prompt"] = p.text
        return {**out, **{k: v for k, v in answer.items() if k not in out}}

    def finish(self, client: HttpClient, server: Server, rows: list[dict]) -> tuple[dict, dict, list[str]]:
        """At least one response counts verify rounds (else the server ran without a drafter);
        then /server_info, as run --server-info reads it."""
        url = client.base + self.generate_path
        if not any(isinstance(r["meta_info"].get("spec_verify_ct"), int) for r in rows):
            raise DiagError("the SGLang server answered without speculative counts", file=url,
                            field="meta_info.spec_verify_ct", expected="present (a server launched with "
                            "--speculative-algorithm EAGLE3 and a drafter)",
                            found=f"absent in all {len(rows)} responses")
        info = client.get(server.info_path or "/server_info")
        files = {"server_info.json": info.text}
        notes = ["server_info.json: avg_spec_accept_length is the server's lifetime average; responses.jsonl "
                 "holds this probe's own counts"]
        return files, {"responses": self.rows_file, "server_info": "server_info.json"}, notes

    def metrics_fields(self, delta: str | None, source: str) -> tuple[dict[str, str], list[str]]:
        """diag run reads no SGLang /metrics: the scrapes are kept, nothing is fed."""
        if delta is None:
            return {}, ["the SGLang server has no /metrics (launch it with --enable-metrics to save them too)"]
        return {}, []


LIVE = SglangLive()
