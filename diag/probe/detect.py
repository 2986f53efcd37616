"""Which engine answers at a URL, which release, which model: asked of the server itself.

Each registered engine family's LiveServer (diag.engines.protocol) is asked in registry order
whether the server is its own, by routes its own http server defines; the first that
recognises it answers with a Server (family, version as reported, served model). The routes
and the JSON are the engine packages' (diag/engines/<family>/live.py).

`--engine` names what the user expects: a family ("<family>"), a release ("<family>-<version>"),
or a bare version, which names the registry's default family (as `diag run --engine` takes it).
A server of another family or release is refused; a local version tag ("0.32.0+cpu") is not
part of the release. Worked example (families f and g, f the default): "g-0.32.0" -> ("g",
"0.32.0"); "f" -> ("f", None); "0.5.23" -> ("f", "0.5.23").
This module knows the registry and the order of questions; nothing about prompts, files or an
engine's JSON.
"""

from __future__ import annotations

import re

from diag.engines import DEFAULT_FAMILY, families, family_rules
from diag.engines.protocol import LiveServer, Server
from diag.errors import DiagError
from diag.probe.client import Client

__all__ = ["Server", "check_engine", "detect", "live", "parse_engine", "release"]

_V = r"\d+(?:\.\d+)*(?:\.?post\d+)?(?:\+[\w.]+)?"       # 0.5.10.post1, 0.32.0+cpu


def live(family: str) -> LiveServer:
    """The LiveServer of a registered family."""
    return family_rules(family).live_server()


def parse_engine(flag: str) -> tuple[str, str | None]:
    """'<family>-<version>' -> (family, version); '<family>' -> (family, None); a bare version ->
    (the default family, version)."""
    names = "|".join(re.escape(f) for f in families())
    m = re.match(rf"^(?:(?P<engine>{names})(?:[-=@ ]?v?(?P<v1>{_V}))?|v?(?P<v2>{_V}))$", flag.strip(), re.I)
    if m is None:
        raise DiagError("unknown engine", field="--engine",
                        expected=", ".join(families()) + ", or <engine>-<version> (e.g. "
                        + ", ".join(f"{f}-{family_rules(f).releases()[-1]}" for f in families()) + ")",
                        found=flag)
    return ((m.group("engine") or DEFAULT_FAMILY).lower(), m.group("v1") or m.group("v2"))


def release(version: str) -> str:
    """'0.32.0+cpu' -> '0.32.0'; 'v0.5.23' -> '0.5.23'."""
    return version.strip().lstrip("v").split("+", 1)[0]


def detect(client: Client) -> Server:
    """The engine at client.base (module docstring); a DiagError when no family recognises it."""
    lives = [live(f) for f in families()]
    for one in lives:
        found = one.detect(client)
        if found is not None:
            return found
    raise DiagError(f"the server is neither {' nor '.join(one.display for one in lives)}", file=client.base,
                    field="--server", expected=" or ".join(one.signature for one in lives),
                    found="no answer in any of these shapes")


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
