"""What a probe sends: the case's prompts, as the replay sees them, and the decoding the server runs.

With a target (a case, or --target), each prompt goes as token ids under the case's serving
rendering (diag.run.rendered, the same ids `diag run` replays), so the server and diag read
the same tokens; the decoding is the run's served decoding (diag.run.decodings: the case's
[decoding] / flags, else the target's generation_config.json, else greedy). Without a target,
each prompt goes as its text and the server's tokenizer decides the ids; a chat prompt
(messages, no text) then has nothing to send and is refused.
Worked example: mixed-48.jsonl, limit 2, max_new_tokens 64, no [decoding] ->
ProbePlan(prompts (code-01, ids [1, 9, 4, ...]), (code-02, ...), decoding greedy, 64 tokens).

This module reads prompt files and the tokenizer (no weights); it knows nothing about HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diag.engines.decoding import Decoding
from diag.errors import DiagError
from diag.run.case import Case, resolve_path
from diag.run.prompts import PromptSet, read_prompt_set


@dataclass(frozen=True)
class ProbePrompt:
    id: str
    text: str | None                    # the prompt set's text (None for a chat conversation)
    ids: tuple[int, ...] | None         # token ids under the serving rendering; None: send text


@dataclass(frozen=True)
class ProbePlan:
    prompts: tuple[ProbePrompt, ...]
    decoding: Decoding
    max_new_tokens: int
    prompt_file: str
    prompt_sha256: str
    decoding_source: str
    rendering: str | None               # the serving rendering's name; None when sent as text

    @property
    def sent_as(self) -> str:
        return "text" if self.rendering is None else "token ids"


def _check_max(n: int, field: str) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DiagError("max_new_tokens must be a positive integer", field=field, expected=">= 1", found=n)
    return n


def from_case(case: Case) -> ProbePlan:
    """Token ids under the case's serving rendering; the run's served decoding."""
    from diag.run.decodings import plan as decoding_plan
    from diag.run.inputs import checkpoint_path, served_by, trusts_remote_code
    from diag.run.rendered import render_prompts
    from diag.target.tokenizer import load_tokenizer
    tpath = checkpoint_path(case.target.path, case, "target.path")
    tok = load_tokenizer(tpath, trust_remote_code=trusts_remote_code(case))
    pset = read_prompt_set(resolve_path(case.prompts.file, case, "prompts.file"), case.prompts.limit,
                           case.prompts.categories or None)
    rendered = render_prompts(case, tok, pset, str(Path(tpath) / "tokenizer_config.json"))
    ids = {pid: tuple(t) for pid, _, t in rendered.ids[rendered.serving]}
    rel, eng = served_by(case)
    launch = eng.parse_launch(case.serving.launch, release=rel) if case.serving.launch else None
    dplan = decoding_plan(case, Path(tpath), launch)
    prompts = tuple(ProbePrompt(p.id, p.text, ids[p.id]) for p in pset.prompts)
    return ProbePlan(prompts, dplan.served, _check_max(case.prompts.max_new_tokens, "prompts.max_new_tokens"),
                     pset.path, pset.sha256, dplan.source, rendered.serving)


def from_prompts(path: str, *, limit: int | None, max_new_tokens: int, decoding: Decoding,
                 decoding_source: str) -> ProbePlan:
    """Each prompt's text as the server's input (no tokenizer here)."""
    pset: PromptSet = read_prompt_set(path, limit)
    chats = [p.id for p in pset.prompts if p.text is None]
    if chats:
        raise DiagError("chat prompts need the target's chat template, which diag applies only with a target",
                        file=pset.path, field=f"prompt {chats[0]}", expected="a text prompt, or --target / a case",
                        found=f"{len(chats)} conversation(s) without text")
    prompts = tuple(ProbePrompt(p.id, p.text, None) for p in pset.prompts)
    return ProbePlan(prompts, decoding, _check_max(max_new_tokens, "--max-new-tokens"), pset.path, pset.sha256,
                     decoding_source, None)
