"""The target's tokenizer, from its own folder, running remote code only when trusted.

Kimi's tokenizer is remote code: tokenizer_config.json names
`"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]}`, a tiktoken
tokenizer over `tiktoken.model`, with its chat template in `chat_template.jinja`; the seeds'
SGLang launch passes `--trust-remote-code` for it. diag refuses such a tokenizer unless the
user trusts it (`diag run --trust-remote-code`, `[target] trust_remote_code = true`, or
`--trust-remote-code` in the case's launch command), before transformers would prompt or run
anything. Only the tokenizer's code may run: target models are built from transformers' own
classes (int4/skeleton.py), never from auto_map.

This module knows tokenizer files; nothing about models or prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

from diag.errors import DiagError

TRUST_FLAG = "--trust-remote-code"


def remote_tokenizer_class(path: Path) -> str | None:
    """The auto_map class a tokenizer_config.json asks to import, or None.
    {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]}}
    -> "tokenization_kimi.TikTokenTokenizer"."""
    cfg_file = Path(path) / "tokenizer_config.json"
    try:
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    except json.JSONDecodeError as err:
        raise DiagError("tokenizer_config.json is not valid JSON", file=str(cfg_file), expected="a JSON object",
                        found=str(err)) from err
    entry = (cfg.get("auto_map") or {}).get("AutoTokenizer") if isinstance(cfg, dict) else None
    if isinstance(entry, (list, tuple)):
        entry = next((e for e in entry if e), None)
    return entry if isinstance(entry, str) else None


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False):
    path = Path(path)
    remote = remote_tokenizer_class(path)
    if remote is not None and not trust_remote_code:
        raise DiagError("the target's tokenizer is remote code, which diag runs only when told to",
                        file=str(path / "tokenizer_config.json"), field="auto_map.AutoTokenizer",
                        expected=f"{TRUST_FLAG} (or [target] trust_remote_code = true, or {TRUST_FLAG} "
                        "in the case's launch command)", found=remote)
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, ImportError) as err:
        raise DiagError("cannot load the target's tokenizer", file=str(path),
                        expected="tokenizer.json / tokenizer_config.json (remote code: its imports installed)",
                        found=str(err).splitlines()[0]) from err
    except (AttributeError, KeyError, TypeError):
        # AutoTokenizer also parses config.json, and some transformers versions crash on a
        # model_type they do not know (kimi_k2); the tokenizer files alone are enough
        if not (path / "tokenizer.json").is_file():
            raise
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast.from_pretrained(str(path))
