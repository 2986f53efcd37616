"""What a request that sets no sampling parameter runs on an SGLang server (DESIGN.md §11).

- `--sampling-defaults model` (the server default): a request that sets nothing takes the
  non-null temperature / top_p / top_k of the target's generation_config.json, else SGLang's own
  defaults (temperature 1.0, top_p 1.0, top_k -1); `openai` ignores generation_config.json.
  generation_config's `do_sample` is not read by SGLang.
Worked example: generation_config {"temperature": 0.6, "top_p": 0.95} -> t0.6-p0.95-k-1, from
generation_config.json. The Decoding itself is engine-neutral (diag/engines/decoding.py).
This module knows config values; it reads no file.
"""

from __future__ import annotations

from diag.engines.common import RequestDefaults

SGLANG_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k")       # what verification uses
UNMODELLED_KEYS = ("min_p", "repetition_penalty")                # SGLang reads them; diag does not


def request_defaults(generation_config: dict | None, sampling_defaults: str = "model") -> RequestDefaults:
    """SGLang's ModelConfig.get_default_sampling_params over its SamplingParams defaults.
    Example: {"temperature": 0.6, "top_p": 0.95} -> t0.6-p0.95-k-1 from generation_config.json;
    None (or --sampling-defaults openai) -> temperature 1.0, top_p 1.0, top_k -1."""
    given = {}
    if sampling_defaults == "model" and generation_config:
        given = {k: generation_config[k] for k in GENERATION_CONFIG_KEYS + UNMODELLED_KEYS
                 if generation_config.get(k) is not None}
    values = {**SGLANG_DEFAULTS, **{k: v for k, v in given.items() if k in GENERATION_CONFIG_KEYS}}
    source = "generation_config.json" if any(k in given for k in GENERATION_CONFIG_KEYS) else "SGLang defaults"
    return RequestDefaults(values, source, {k: v for k, v in given.items() if k in UNMODELLED_KEYS})
