"""What an SGLang server answers: `/generate` responses (per-request `meta_info`) and
`/server_info` (`internal_states[].avg_spec_accept_length`), read by the release that wrote them.

Per request (managers/tokenizer_manager.py, `_calculate_spec_decoding_metrics`), with
a = accepted drafts per verify round and the first completion token coming from prefill:
  spec_verify_ct     verify rounds                              R
  completion_tokens  1 + Σ(a+1), fewer when max_new_tokens cut the last round
  spec_accept_length completion_tokens / spec_verify_ct         SGLang's own per-request number
  accepted drafts    Σa under the release's key (below)         -> diag's 1 + Σa / R
  proposed drafts    R · (D-1)                                  -> D, the tree the server ran
Keys by release (each read from its wheel):
  0.5.6  - 0.5.10.post1  spec_accept_token_num, spec_draft_token_num; spec_accept_histogram from 0.5.9
  0.5.11                 spec_accepted_drafts, spec_proposed_drafts, spec_accept_histogram
  0.5.12 - 0.5.20        spec_num_correct_drafts, spec_num_proposed_drafts, spec_correct_drafts_histogram,
                         and the 0.5.11 names as deprecated copies
  0.5.21 - 0.5.23        spec_num_correct_drafts, spec_num_proposed_drafts, spec_correct_drafts_histogram only
Worked example (0.5.23, a chain with D = 2): meta_info {"completion_tokens": 64,
"spec_verify_ct": 38, "spec_num_correct_drafts": 25, "spec_num_proposed_drafts": 38} -> R 38,
Σa 25, D 2, accept length 1 + 25/38 = 1.66 (SGLang's own spec_accept_length 64/38 = 1.68 also
counts the prefill token).

A request is identified by a top-level "id" when the file has one (what diag's prompt ids
are), else by `meta_info.id` (SGLang's rid: send `"rid": "<prompt id>"` with each request);
its prompt text, when saved beside it ("prompt", "input_text", or "request": {"text": ...}),
lets diag.diagnoses.live_serving.inputs pair it with a prompt when no id matches.
A response with only completion_tokens and spec_verify_ct (no accepted/proposed counts) is
read by SGLang's own rule, spec_accept_length = completion_tokens / spec_verify_ct
(tokenizer_manager.py): Σa = completion_tokens - 1 - spec_verify_ct, e.g. 64 and 38 -> Σa 25,
1 + 25/38 = 1.66 as above. It cannot tell the tree (D), the acceptance per position, or a last
round cut by max_new_tokens (which it counts as fewer accepted drafts); `notes` says so.
This module parses text into records; it opens no file and knows nothing about prompts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from diag.engines.common import find_key
from diag.engines.sglang.server_releases import Release, ReleaseRange, show
from diag.errors import DiagError


@dataclass(frozen=True)
class KeyRule:
    key: str
    releases: ReleaseRange


ACCEPTED_KEYS = (KeyRule("spec_accept_token_num", ReleaseRange(hi=(0, 5, 10, 1))),
                 KeyRule("spec_accepted_drafts", ReleaseRange((0, 5, 11, 0), (0, 5, 20, 0))),
                 KeyRule("spec_num_correct_drafts", ReleaseRange(lo=(0, 5, 12, 0))))
PROPOSED_KEYS = (KeyRule("spec_draft_token_num", ReleaseRange(hi=(0, 5, 10, 1))),
                 KeyRule("spec_proposed_drafts", ReleaseRange((0, 5, 11, 0), (0, 5, 20, 0))),
                 KeyRule("spec_num_proposed_drafts", ReleaseRange(lo=(0, 5, 12, 0))))
OTHER_KEYS = (KeyRule("spec_accept_histogram", ReleaseRange((0, 5, 9, 0), (0, 5, 20, 0))),
              KeyRule("spec_correct_drafts_histogram", ReleaseRange(lo=(0, 5, 12, 0))),
              KeyRule("spec_cap_length", ReleaseRange(lo=(0, 5, 16, 0))),
              KeyRule("spec_block_accept_length", ReleaseRange(lo=(0, 5, 16, 0))))
NO_ALIAS_SINCE = (0, 5, 21, 0)      # spec_num_correct_drafts without spec_accepted_drafts


@dataclass(frozen=True)
class RequestCounts:
    """One request's verify rounds and accepted drafts, and the tree width it shows."""

    id: str | None                  # None: no id saved; paired by `prompt`
    rounds: int                     # spec_verify_ct
    accepted_sum: int               # Σa
    completion_tokens: int
    num_draft_tokens: int | None    # D = proposed / rounds + 1; None without rounds
    record: int                     # 1-based position in the file
    prompt: str | None = None       # the prompt text saved with the response
    from_lengths: bool = False      # Σa from completion_tokens and spec_verify_ct only

    @property
    def accept_length(self) -> float | None:
        return 1.0 + self.accepted_sum / self.rounds if self.rounds else None


@dataclass(frozen=True)
class GenerateResponses:
    source: str
    release: Release
    requests: tuple[RequestCounts, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerInfo:
    source: str
    version: str | None             # "version" as /server_info reports it
    accept_length: float            # mean over internal_states (one per DP rank)
    ranks: int
    algorithm: str | None
    tree: tuple                     # (S, K, D) as served, None where absent
    max_running_requests: int | None


def _values(text: str, source: str) -> list[tuple[int, object]]:
    """A JSON array or object, or JSON Lines: [(record number, value), ...], batches flattened."""
    try:
        whole = json.loads(text)
        items = whole if isinstance(whole, list) else [whole]
    except json.JSONDecodeError:
        items = []
        for no, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise DiagError("a response line is not JSON", file=source, field=f"line {no}",
                                expected="one /generate response (JSON object) per line", found=str(err)) from None
            items += value if isinstance(value, list) else [value]
    return list(enumerate(items, start=1))


def _int(meta: dict, key: str, where: str, source: str) -> int:
    v = meta.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise DiagError("a /generate response lacks a speculative count", file=source, field=f"{where}.meta_info.{key}",
                        expected="a non-negative integer (SGLang prints it when speculation ran)", found=repr(v))
    return v


def _key(meta: dict, rules, where: str, source: str) -> tuple[str | None, ReleaseRange]:
    present = [r for r in rules if r.key in meta]
    rng = ReleaseRange()
    for r in present:
        rng = rng & r.releases
    if rng is None:
        raise DiagError("a /generate response mixes keys of different SGLang releases", file=source,
                        field=f"{where}.meta_info", expected="one release's meta_info",
                        found=", ".join(f"{r.key} ({r.releases})" for r in present))
    return (present[-1].key if present else None), rng


def _record_releases(meta: dict, where: str, source: str) -> ReleaseRange:
    rng = ReleaseRange()
    for rules in (ACCEPTED_KEYS, PROPOSED_KEYS, *[(r,) for r in OTHER_KEYS]):
        rng = rng & _key(meta, rules, where, source)[1] if rng else None
    if rng is not None and "spec_num_correct_drafts" in meta and "spec_accepted_drafts" not in meta:
        rng = rng & ReleaseRange(lo=NO_ALIAS_SINCE)
    if rng is None:
        raise DiagError("a /generate response mixes keys of different SGLang releases", file=source,
                        field=f"{where}.meta_info", expected="one release's meta_info",
                        found=sorted(k for k in meta if k.startswith("spec_")))
    return rng


def _request(no: int, value, source: str) -> tuple[RequestCounts, ReleaseRange]:
    where = f"record {no}"
    meta = value.get("meta_info") if isinstance(value, dict) else None
    if not isinstance(meta, dict):
        raise DiagError("not a /generate response", file=source, field=where,
                        expected='{"text": ..., "meta_info": {...}} (what POST /generate returns)',
                        found=repr(value)[:120])
    rid, prompt = value.get("id", meta.get("id")), _prompt_text(value)
    if not isinstance(rid, str) or not rid:
        if prompt is None:
            raise DiagError("a /generate response has no request id", file=source, field=f"{where}.meta_info.id",
                            expected="the prompt's id (send rid with the request, or add a top-level id), or its "
                                     'text as "prompt"', found=repr(rid))
        rid = None
    rounds = _int(meta, "spec_verify_ct", where, source)
    completion = _int(meta, "completion_tokens", where, source)
    rng = _record_releases(meta, where, source)
    acc_key, _ = _key(meta, ACCEPTED_KEYS, where, source)
    prop_key, _ = _key(meta, PROPOSED_KEYS, where, source)
    if rounds == 0:
        return RequestCounts(rid, 0, 0, completion, None, no, prompt), rng
    if acc_key is None and prop_key is None:       # SGLang's two-field rule (module docstring)
        return RequestCounts(rid, rounds, max(completion - 1 - rounds, 0), completion, None, no, prompt, True), rng
    if acc_key is None or prop_key is None:
        raise DiagError("a /generate response lacks its accepted-draft counts", file=source, field=f"{where}.meta_info",
                        expected="spec_num_correct_drafts / spec_accepted_drafts / spec_accept_token_num and the "
                                 "matching proposed count", found=sorted(k for k in meta if k.startswith("spec_")))
    accepted, proposed = _int(meta, acc_key, where, source), _int(meta, prop_key, where, source)
    if proposed % rounds or accepted > proposed:
        raise DiagError("a /generate response's draft counts do not add up", file=source, field=f"{where}.meta_info",
                        expected=f"{prop_key} a multiple of spec_verify_ct and >= {acc_key}",
                        found={"spec_verify_ct": rounds, acc_key: accepted, prop_key: proposed})
    return RequestCounts(rid, rounds, accepted, completion, proposed // rounds + 1, no, prompt), rng


def _prompt_text(value: dict) -> str | None:
    request = value.get("request")
    for text in (value.get("prompt"), value.get("input_text"), request.get("text") if isinstance(request, dict)
                 else None):
        if isinstance(text, str):
            return text
    return None


def _notes(requests: list[RequestCounts]) -> tuple[str, ...]:
    n = sum(r.from_lengths for r in requests)
    if not n:
        return ()
    return (f"{n} of {len(requests)} /generate responses carry only completion_tokens and spec_verify_ct: "
            "accepted drafts taken as completion_tokens - 1 - spec_verify_ct (SGLang's spec_accept_length = "
            "completion_tokens / spec_verify_ct, which also counts the prefill token); they cannot tell the tree "
            "width, the acceptance per draft position, or a last round cut by max_new_tokens (counted as fewer "
            "accepted drafts)",)


def read_generate_responses(text: str, *, source: str, release: Release) -> GenerateResponses:
    """Parse saved /generate responses. Errors: not responses, no id, counts missing or not
    adding up, keys of several releases, keys the declared release does not print, duplicate ids."""
    out, common, seen = [], ReleaseRange(), {}
    for no, value in _values(text, source):
        req, rng = _request(no, value, source)
        if req.id is not None and req.id in seen:
            raise DiagError("two /generate responses carry the same request id", file=source,
                            field=f"records {seen[req.id]} and {no}", expected="one response per prompt", found=req.id)
        seen[req.id] = no
        both = common & rng
        if both is None:
            raise DiagError("the response file mixes SGLang releases", file=source, field=f"record {no}",
                            expected=f"meta_info as {common} prints it", found=f"meta_info only {rng} prints")
        common = both
        out.append(req)
    if not out:
        raise DiagError("the response file holds no /generate response", file=source, field="records",
                        expected="at least one", found=0)
    if release not in common:
        raise DiagError("the responses were not written by the declared SGLang release", file=source,
                        field="meta_info", expected=f"meta_info as SGLang {show(release)} prints it",
                        found=f"keys only {common} prints",
                        hint="set [server] engine (or --server-engine) to the release that served them")
    return GenerateResponses(source, release, tuple(out), _notes(out))


def read_server_info(text: str, *, source: str) -> ServerInfo:
    """Parse a saved GET /server_info: the accept length over the server's lifetime (mean over
    DP ranks), its version, and the speculative settings after SGLang's rewrites."""
    try:
        info = json.loads(text)
    except json.JSONDecodeError as err:
        raise DiagError("the server info is not JSON", file=source, expected="the body of GET /server_info",
                        found=str(err)) from None
    states = info.get("internal_states") if isinstance(info, dict) else None
    if not isinstance(states, list):
        raise DiagError("not a /server_info body", file=source, field="internal_states",
                        expected="a list (one entry per DP rank)", found=repr(states)[:80])
    lengths = [s["avg_spec_accept_length"] for s in states
               if isinstance(s, dict) and isinstance(s.get("avg_spec_accept_length"), (int, float))]
    if not lengths:
        raise DiagError("the server info has no speculative accept length", file=source,
                        field="internal_states[].avg_spec_accept_length",
                        expected="a number (present once a speculative server has decoded)", found="absent")
    tree = tuple(find_key(info, k) for k in ("speculative_num_steps", "speculative_eagle_topk",
                                          "speculative_num_draft_tokens"))
    version = info.get("version")
    return ServerInfo(source, version if isinstance(version, str) else None, sum(lengths) / len(lengths),
                      len(lengths), find_key(info, "speculative_algorithm"), tree, find_key(info, "max_running_requests"))
