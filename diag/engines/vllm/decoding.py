"""What a vLLM request that sets no sampling parameter runs (table.py "request_defaults").

vLLM's `--generation-config auto` (the default in every release diag knows) takes the target's
generation_config.json values for the keys the release lists, over SamplingParams' defaults
(temperature 1.0, top_p 1.0, top_k -1 up to 0.8.5.post1 and 0 after: both mean "no top-k");
`--generation-config vllm` takes SamplingParams' defaults alone.
Worked example (vLLM 0.32.0): {"temperature": 0.6, "top_p": 0.95, "repetition_penalty": 1.05}
-> temperature 0.6, top_p 0.95, top_k -1 from generation_config.json; repetition_penalty unmodelled.
This module knows dicts and the rows; it reads no file.
"""

from __future__ import annotations

from diag.engines.common import RequestDefaults
from diag.engines.vllm.releases import VllmRelease, rule

MODELLED = ("temperature", "top_p", "top_k")


def request_defaults(generation_config: dict | None, sampling_defaults: str, eng: str | VllmRelease | None) \
        -> RequestDefaults:
    """sampling_defaults: "model" / "auto" (the launch default) or "vllm" / "openai" (engine defaults)."""
    _, keys, own = rule("request_defaults", eng)
    values = {k: float(v) for k, v in (kv.split("=") for kv in own.removeprefix("SamplingParams: ").split())}
    values["top_k"] = -1 if values["top_k"] <= 0 else int(values["top_k"])        # 0 and -1: no top-k
    read = keys.removeprefix("generation_config.json keys: ").split()
    given = {k: generation_config[k] for k in read if (generation_config or {}).get(k) is not None} \
        if sampling_defaults in ("model", "auto") else {}
    for k in MODELLED:
        if k in given:
            values[k] = -1 if k == "top_k" and given[k] <= 0 else given[k]
    source = "generation_config.json" if any(k in given for k in MODELLED) else "vLLM defaults"
    return RequestDefaults(values, source, {k: v for k, v in given.items() if k not in MODELLED
                                           and k != "max_new_tokens" and k != "skip_special_tokens"})
