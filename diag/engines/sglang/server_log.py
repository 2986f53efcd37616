"""SGLang's scheduler log, read by the release that wrote it: the decode lines ("accept len",
"accept rate", "gen throughput", "#running-req", "#queue-req") and the `server_args=` line.

A decode line as every covered release formats it (the message, after the logger's
"[%(asctime)s TP0] " prefix):
  Decode batch, #running-req: 8, #token: 5120, token usage: 0.03, accept len: 1.68,
  accept rate: 0.84, cuda graph: True, gen throughput (token/s): 56.80, #queue-req: 0
Where the format changed (each release read from its wheel):
  0.5.6 - 0.5.8    managers/scheduler_metrics_mixin.py: the message ends "#queue-req: N, "
                   (a trailing comma, nothing after it)
  0.5.9 - 0.5.23   it ends "#queue-req: N"; since 0.5.10 (observability/scheduler_metrics_mixin.py)
                   ", est. decode TFLOPS/s (per GPU): ..." may follow; since 0.5.11 ", fwd occupancy: X%"
  0.5.16 - 0.5.23  scheduler_components/metrics_reporter.py (since 0.5.13) may add "cap len: X, " and
                   "block accept len: X, " after the accept rate
The accept rate's formula changed at 0.5.11 without a change of format (server_releases.py), so
a log cannot name its release alone: the reader takes the declared release, and checks that
every line could have been written by it.

`accept len` = Σ(a+1) / rounds over one log interval (decode_log_interval forward passes, each
adding one round per running request): the pooled accept length of the requests then running.
Only speculative servers print the two accept fields; a decode line without them is a plain one.

The `server_args=` line (entrypoints/engine.py) prints ServerArgs after post-processing, so it
shows the tree the server really ran: `ServerArgs(..., speculative_num_steps=1, ...)` up to
0.5.21, a dict `{'speculative_num_steps': 1, ...}` (possibly nested) from 0.5.22.

This module parses text into records; it opens no file and knows nothing about models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diag.engines.sglang.server_releases import Release, ReleaseRange, rate_formula, show
from diag.errors import DiagError

# "[2026-03-01 10:00:00 DP0 TP0] " (scheduler.py: DP, PP, ATTN_CP, MOE_DP, TP, EP ranks when > 1)
_PREFIX = re.compile(r"^\[(?P<time>[^\]]*?)(?P<rank>(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+)*)\] ")
_RUNNING = re.compile(r"#running-req: (\d+), ")
_ACCEPT = re.compile(r"accept len: (\d+\.\d\d), accept rate: (\d+\.\d\d), ")
_GEN = re.compile(r"[a-z]+ graph: (?:True|False), gen throughput \(token/s\): (\d+\.\d\d), #queue-req: (\d+)(.*)$")


@dataclass(frozen=True)
class Marker:
    """A feature of a decode line that only some releases print."""

    name: str
    pattern: re.Pattern
    releases: ReleaseRange


# A line's tail after "#queue-req: N": "," (0.5.6-0.5.8) or nothing / a suffix (0.5.9 on).
TRAILING_COMMA = Marker("trailing ', ' after #queue-req", re.compile(r"#queue-req: \d+,\s*$"),
                        ReleaseRange(hi=(0, 5, 8, 0)))
NO_TRAILING_COMMA = Marker("no trailing ', ' after #queue-req", re.compile(r"#queue-req: \d+(?!,\s*$)(?:, |$)"),
                           ReleaseRange(lo=(0, 5, 9, 0)))
MARKERS = (
    TRAILING_COMMA, NO_TRAILING_COMMA,
    Marker("est. decode TFLOPS", re.compile(r", est\. decode TFLOPS/s"), ReleaseRange(lo=(0, 5, 10, 0))),
    Marker("fwd occupancy", re.compile(r", fwd occupancy: "), ReleaseRange(lo=(0, 5, 11, 0))),
    Marker("cap len", re.compile(r", cap len: \d"), ReleaseRange(lo=(0, 5, 16, 0))),
    Marker("block accept len", re.compile(r", block accept len: "), ReleaseRange(lo=(0, 5, 16, 0))),
)


@dataclass(frozen=True)
class DecodeLine:
    """One "Decode batch" line. accept_len / accept_rate are None on a plain (non-speculative) line."""

    line_no: int                    # 1-based, in the file
    rank: str                       # "TP0", "DP1 TP8", "" when the prefix is absent
    running_req: int
    queue_req: int
    gen_throughput: float           # tokens/s over all running requests, as printed
    accept_len: float | None
    accept_rate: float | None
    markers: tuple[str, ...]        # names of the release-specific features it shows
    releases: ReleaseRange          # the releases that could have printed it


@dataclass(frozen=True)
class ServerArgsLine:
    """The speculative fields of one `server_args=` line (None = absent or None there)."""

    line_no: int
    algorithm: str | None
    num_steps: int | None
    topk: int | None
    num_draft_tokens: int | None
    max_running_requests: int | None

    @property
    def tree(self) -> tuple:
        return (self.num_steps, self.topk, self.num_draft_tokens)


@dataclass(frozen=True)
class ServerLog:
    source: str
    release: Release                # the release that wrote it (declared, checked)
    rate_formula: str               # metrics.py name of its accept-rate formula
    speculative: tuple[DecodeLine, ...]
    server_args: ServerArgsLine | None


def _markers(text: str, line_no: int, source: str) -> tuple[tuple[str, ...], ReleaseRange]:
    """The release-specific features a line shows, and the releases that print all of them."""
    names, rng = [], ReleaseRange()
    for m in MARKERS:
        if m.pattern.search(text):
            names.append(m.name)
            rng = rng & m.releases
            if rng is None:
                raise DiagError("a Decode batch line combines features no single SGLang release prints",
                                file=source, field=f"line {line_no}", expected="one release's format",
                                found=", ".join(names))
    return tuple(names), rng


def parse_decode_line(line: str, line_no: int, source: str) -> DecodeLine | None:
    """One log line -> DecodeLine, or None when it is not a decode line. A decode line that lacks
    a field every covered release prints is an error (truncated, or not SGLang's format)."""
    at = line.find("Decode batch")
    if at < 0:
        return None
    pre = _PREFIX.match(line)
    msg = line[at:].rstrip("\n")
    running, gen = _RUNNING.search(msg), _GEN.search(msg)
    if running is None or gen is None:
        raise DiagError("a Decode batch line lacks fields SGLang always prints", file=source,
                        field=f"line {line_no}", expected="#running-req: N, ... gen throughput (token/s): X.XX, "
                        "#queue-req: N", found=msg[:200])
    acc = _ACCEPT.search(msg)
    names, rng = _markers(msg, line_no, source)
    return DecodeLine(line_no, (pre.group("rank").strip() if pre else ""), int(running.group(1)),
                      int(gen.group(2)), float(gen.group(1)),
                      float(acc.group(1)) if acc else None, float(acc.group(2)) if acc else None, names, rng)


_ARG = r"""['"]?{name}['"]?\s*[=:]\s*(?P<v>None|True|False|-?\d+|'[^']*'|"[^"]*")"""


def _arg(text: str, name: str):
    m = re.search(_ARG.format(name=name), text)
    if m is None or m.group("v") == "None":
        return None
    v = m.group("v")
    return v.strip("'\"") if v[0] in "'\"" else int(v) if v.lstrip("-").isdigit() else v == "True"


def parse_server_args(line: str, line_no: int) -> ServerArgsLine | None:
    """`server_args=ServerArgs(...)` or `server_args={...}` -> its speculative fields."""
    at = line.find("server_args=")
    if at < 0:
        return None
    text = line[at:]
    return ServerArgsLine(line_no, _arg(text, "speculative_algorithm"), _arg(text, "speculative_num_steps"),
                          _arg(text, "speculative_eagle_topk"), _arg(text, "speculative_num_draft_tokens"),
                          _arg(text, "max_running_requests"))


def _check_releases(lines: list[DecodeLine], rel: Release, source: str) -> None:
    """Every line must come from one release range, and the declared release must lie in it."""
    common = ReleaseRange()
    for i, ln in enumerate(lines):
        both = common & ln.releases
        if both is None:    # ranges are intervals: some earlier line alone excludes this one
            first = next(x for x in lines[:i] if (x.releases & ln.releases) is None)
            raise DiagError("the log mixes lines of different SGLang releases", file=source,
                            field=f"lines {first.line_no} and {ln.line_no}",
                            expected="one server release per log file",
                            found=f"line {first.line_no} as {first.releases} prints it ({', '.join(first.markers)}); "
                                  f"line {ln.line_no} as {ln.releases} prints it ({', '.join(ln.markers)})",
                            hint="split the log at the restart, one file per server release")
        common = both
    if rel not in common:
        ln = next(x for x in lines if rel not in x.releases)
        raise DiagError("the log was not written by the declared SGLang release", file=source,
                        field=f"line {ln.line_no}", expected=f"a line as SGLang {show(rel)} formats it",
                        found=f"a line only {ln.releases} prints ({', '.join(ln.markers)})",
                        hint=f"set [server] engine (or --server-engine) to the release that wrote it, {common}")


def _one_config(found: list[ServerArgsLine], source: str) -> ServerArgsLine | None:
    configs = {(a.algorithm, a.tree, a.max_running_requests) for a in found}
    if len(configs) > 1:
        a, b = found[0], next(x for x in found if (x.algorithm, x.tree, x.max_running_requests)
                              != (found[0].algorithm, found[0].tree, found[0].max_running_requests))
        raise DiagError("the log holds two server launches with different speculative settings", file=source,
                        field=f"server_args lines {a.line_no} and {b.line_no}", expected="one launch per log file",
                        found=f"(S, K, D) {a.tree} max_running_requests {a.max_running_requests} vs "
                              f"{b.tree} max_running_requests {b.max_running_requests}",
                        hint="split the log at the restart")
    return found[0] if found else None


def read_server_log(text: str, *, source: str, release: Release) -> ServerLog:
    """Parse a whole scheduler log written by SGLang `release`. Errors: no decode line at all, no
    speculative decode line, lines of several releases, lines the release cannot print, two
    launches with different speculative settings, a mix of plain and speculative decoding."""
    decode, args = [], []
    for no, line in enumerate(text.splitlines(), start=1):
        d = parse_decode_line(line, no, source)
        if d is not None:
            decode.append(d)
        elif (a := parse_server_args(line, no)) is not None:
            args.append(a)
    spec = [d for d in decode if d.accept_len is not None]
    if not spec:
        raise DiagError("the server log has no speculative decode line", file=source, field="accept len",
                        expected="'Decode batch, ... accept len: X.XX, accept rate: Y.YY, ...' lines (SGLang prints "
                                 "them only with --speculative-algorithm)",
                        found=f"{len(decode)} decode lines without accept len" if decode else "no 'Decode batch' line",
                        hint="give the scheduler's log (stdout/stderr of sglang.launch_server) of the speculative run")
    if len(spec) != len(decode):
        plain = next(d for d in decode if d.accept_len is None)
        raise DiagError("the log mixes plain and speculative decoding", file=source, field=f"line {plain.line_no}",
                        expected="only speculative decode lines", found=f"{len(decode) - len(spec)} plain decode lines "
                        f"among {len(decode)}", hint="give the baseline run's log as [server] baseline_log")
    _check_releases(spec, release, source)
    return ServerLog(source, release, rate_formula(release), tuple(spec), _one_config(args, source))


def read_baseline_log(text: str, *, source: str) -> tuple[DecodeLine, ...]:
    """The decode lines of a plain (non-speculative) run: its tokens/s are the baseline."""
    decode = [d for no, line in enumerate(text.splitlines(), start=1)
              if (d := parse_decode_line(line, no, source)) is not None]
    if not decode:
        raise DiagError("the baseline log has no decode line", file=source, field="Decode batch",
                        expected="'Decode batch, ... gen throughput (token/s): X.XX, ...' lines", found="none")
    spec = next((d for d in decode if d.accept_len is not None), None)
    if spec is not None:
        raise DiagError("the baseline log is from a speculative run", file=source, field=f"line {spec.line_no}",
                        expected="decode lines without accept len (a server launched without speculation)",
                        found=f"accept len: {spec.accept_len:.2f}")
    return tuple(decode)
