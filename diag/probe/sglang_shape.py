"""SGLang's `/generate`: the request diag sends and the record it saves.

Request (GenerateReqInput, srt/managers/io_struct.py of SGLang 0.5.23; one prompt, not a batch):
  {"rid": "<prompt id>", "input_ids": [ids] | "text": "<prompt>", "return_logprob": false,
   "stream": false, "sampling_params": {"max_new_tokens": N, "temperature": 0.0}}
Greedy is temperature 0 (SGLang then samples top_k = 1); a sampled decoding sends temperature,
top_p and top_k (-1: all tokens), each as diag evaluates it. Every value is sent, so the
server's request defaults (--sampling-defaults, generation_config.json) never decide.
Response: {"text": ..., "output_ids": [...], "meta_info": {"id": rid, "completion_tokens": ...,
"spec_verify_ct": ..., "spec_num_correct_drafts": ..., ...}} (tokenizer_manager.py).

Saved record (one JSON line per prompt, what diag.engines.sglang.server_responses reads): the response
with a top-level "id" (the prompt id) and "prompt" (its text), e.g.
  {"id": "code-01", "prompt": "def f(x): ...", "text": "...", "meta_info": {"id": "code-01", ...}}
This module knows SGLang's JSON; it sends nothing itself.
"""

from __future__ import annotations

from diag.engines.decoding import Decoding
from diag.errors import DiagError
from diag.probe.plan import ProbePrompt


def sampling_params(dec: Decoding, max_new_tokens: int) -> dict:
    """Greedy -> {"max_new_tokens": 64, "temperature": 0.0};
    t0.7-p0.9-k20 -> {..., "temperature": 0.7, "top_p": 0.9, "top_k": 20}."""
    if dec.greedy:
        return {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    return {"max_new_tokens": max_new_tokens, "temperature": dec.temperature, "top_p": dec.top_p,
            "top_k": dec.top_k}


def request(p: ProbePrompt, dec: Decoding, max_new_tokens: int) -> dict:
    body = {"rid": p.id, "sampling_params": sampling_params(dec, max_new_tokens), "return_logprob": False,
            "stream": False}
    if p.ids is not None:
        body["input_ids"] = list(p.ids)
    else:
        body["text"] = p.text
    return body


def record(p: ProbePrompt, answer, url: str) -> dict:
    """The saved line for one answer; a DiagError when it is not a /generate response for p."""
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


def check_speculated(records: list[dict], url: str) -> None:
    """At least one response counts verify rounds; else the server ran without a drafter."""
    if not any(isinstance(r["meta_info"].get("spec_verify_ct"), int) for r in records):
        raise DiagError("the SGLang server answered without speculative counts", file=url,
                        field="meta_info.spec_verify_ct", expected="present (a server launched with "
                        "--speculative-algorithm EAGLE3 and a drafter)",
                        found=f"absent in all {len(records)} responses")
