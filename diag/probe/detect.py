"""Which engine answers at a URL, which release, which model: asked of the server itself.

Order of questions (each endpoint is one the engine's own http server defines):
  GET /version        vLLM answers {"version": "0.32.0"}; SGLang has no such route (404)
  GET /metrics        vLLM's samples are named vllm:*; confirms a /version answer is vLLM's
  GET /v1/models      vLLM: data[].id is the served model name (the `model` of a request)
  GET /server_info    SGLang (0.5.x); older releases only /get_server_info. Its
                      "internal_states" list (one entry per DP rank) marks SGLang; "version" the release
  GET /model_info     SGLang: served_model_name (older: /get_model_info)
Worked example: /version 404, /server_info {"version": "0.5.23", "internal_states": [...]},
/model_info {"served_model_name": "llama-tiny"} -> Server("sglang", "0.5.23", "llama-tiny").

`--engine` names what the user expects: "sglang", "vllm", "sglang-0.5.23", "vllm-0.32.0", or
a bare SGLang release "0.5.23" (as `diag run --engine` takes it). A server of another engine
or release is refused; a local version tag ("0.32.0+cpu") is not part of the release.
This module knows endpoints and their JSON; nothing about prompts or files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.engines.common import find_key
from diag.errors import DiagError
from diag.probe.client import Client
from diag.probe.prometheus import names

ENGINES = ("sglang", "vllm")
_V = r"\d+(?:\.\d+)*(?:\.?post\d+)?(?:\+[\w.]+)?"       # 0.5.10.post1, 0.32.0+cpu
_FLAG = re.compile(rf"^(?:(?P<engine>sglang|vllm)(?:[-=@ ]?v?(?P<v1>{_V}))?|v?(?P<v2>{_V}))$", re.I)


@dataclass(frozen=True)
class Server:
    engine: str                 # "sglang" | "vllm"
    version: str | None         # as the server reports it
    model: str | None           # the served model name (vLLM: the request's `model`)
    url: str
    info_text: str | None = None    # SGLang: the /server_info body as served
    info_path: str | None = None    # which route answered


def parse_engine(flag: str) -> tuple[str, str | None]:
    """'vllm-0.32.0' -> ('vllm', '0.32.0'); 'sglang' -> ('sglang', None); '0.5.23' -> ('sglang', '0.5.23')."""
    m = _FLAG.match(flag.strip())
    if m is None:
        raise DiagError("unknown engine", field="--engine", expected="sglang, vllm, sglang-0.5.X or vllm-0.X.Y",
                        found=flag)
    return ((m.group("engine") or "sglang").lower(), m.group("v1") or m.group("v2"))


def release(version: str) -> str:
    """'0.32.0+cpu' -> '0.32.0'; 'v0.5.23' -> '0.5.23'."""
    return version.strip().lstrip("v").split("+", 1)[0]


def _json_dict(reply) -> dict | None:
    if reply is None:
        return None
    try:
        value = reply.json()
    except DiagError:
        return None
    return value if isinstance(value, dict) else None


def _vllm(client: Client, version: str) -> Server | None:
    metrics = client.get("/metrics", ok_missing=True)
    if metrics is None or not any(n.startswith("vllm:") for n in names(metrics.text)):
        return None
    models = _json_dict(client.get("/v1/models", ok_missing=True)) or {}
    ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
    return Server("vllm", version, ids[0] if len(ids) == 1 else None, client.base)


def _sglang(client: Client) -> Server | None:
    for path in ("/server_info", "/get_server_info"):
        reply = client.get(path, ok_missing=True)
        info = _json_dict(reply)
        if info is not None and isinstance(info.get("internal_states"), list):
            model = _json_dict(client.get("/model_info", ok_missing=True)) or \
                _json_dict(client.get("/get_model_info", ok_missing=True)) or {}
            name = model.get("served_model_name") or find_key(info, "served_model_name") or \
                model.get("model_path") or find_key(info, "model_path")
            version = info.get("version")
            return Server("sglang", version if isinstance(version, str) else None,
                          name if isinstance(name, str) else None, client.base, reply.text, path)
    return None


def detect(client: Client) -> Server:
    """The engine at client.base (module docstring); a DiagError when it is neither."""
    version = _json_dict(client.get("/version", ok_missing=True))
    if version is not None and isinstance(version.get("version"), str) and "internal_states" not in version:
        found = _vllm(client, version["version"])
        if found is not None:
            return found
    found = _sglang(client)
    if found is not None:
        return found
    raise DiagError("the server is neither SGLang nor vLLM", file=client.base, field="--server",
                    expected="SGLang (GET /server_info with internal_states) or vLLM (GET /version and vllm:* "
                             "samples in GET /metrics)",
                    found=f"GET /version -> {version if version is not None else 'no JSON object'}; "
                          "no SGLang /server_info")


def check_engine(server: Server, flag: str | None) -> None:
    """Refuse a server that is not the engine (and release) --engine names."""
    if flag is None:
        return
    engine, version = parse_engine(flag)
    found = f"{server.engine} {server.version or '(version not reported)'} at {server.url}"
    if engine != server.engine:
        raise DiagError("the server is not the engine named", field="--engine", expected=flag, found=found,
                        hint=f"drop --engine, or give --engine {server.engine}"
                             + (f"-{release(server.version)}" if server.version else ""))
    if version is not None and server.version is not None and release(server.version) != release(version):
        raise DiagError("the server runs another release than the one named", field="--engine",
                        expected=f"{engine} {version}", found=found)
