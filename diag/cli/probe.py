"""`diag probe [CASE] --server URL`: the live server as an input. Sends the case's prompts with
the case's decoding to a running SGLang (/generate) or vLLM (/v1/completions) server and saves
its answers, /metrics and /server_info where `diag run --server-*` reads them.

Where the prompts come from: a case file, or --target (token ids under the target's
rendering), or only --prompts (text; the server tokenizes). With none of them, the demo case.
`diag run CASE --server URL` calls `probe_case` below, then runs as with --server-responses /
--server-info / --server-metrics.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from diag.engines import DEFAULT_ENGINE, families
from diag.errors import DiagError

DEFAULT_TIMEOUT, DEFAULT_RETRIES, DEFAULT_CONCURRENCY = 300.0, 3, 8


def register(sub) -> None:
    p = sub.add_parser("probe", help=f"send the case's prompts to a live server ({', '.join(families())}) and "
                                     "save what it answers (responses, /metrics, /server_info) for "
                                     "`diag run --server-*`")
    p.add_argument("case", nargs="?", help="case file (its prompts, decoding and target tokenizer)")
    p.add_argument("--server", required=True, help="the server's URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--engine", help=f"the engine the server must be: a family ({', '.join(families())}) or a "
                   f"release <family>-<version>, e.g. {DEFAULT_ENGINE}")
    p.add_argument("--model", help="the served model name to send to (default: the one the server serves)")
    p.add_argument("--target", help="target checkpoint (or zoo:NAME): prompts go as its token ids")
    p.add_argument("--prompts", help="JSONL prompt set (replaces the case's)")
    p.add_argument("--limit", type=int, help="use only the first N prompts")
    p.add_argument("--max-new-tokens", type=int, help="tokens to generate per prompt (default: the case's, else 64)")
    p.add_argument("--temperature", action="append", type=float, default=[], help="sampled decoding (the first "
                   "value of a sweep is sent)")
    p.add_argument("--top-p", action="append", type=float, default=[], help="top-p of sampled decoding")
    p.add_argument("--top-k", action="append", type=int, default=[], help="top-k of sampled decoding, -1 = all")
    p.add_argument("--out", help="folder to save into (default reports/<case name>-server)")
    p.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="requests in flight (default 8)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per request (default 300)")
    p.add_argument("--retries", type=int, default=DEFAULT_RETRIES,
                   help="retries on connection errors and 5xx, with backoff (default 3)")
    p.add_argument("--trust-remote-code", action="store_true", help="run the target tokenizer's own code")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _case(a):
    """The case the flags name, or None for a prompts-only probe."""
    from diag.cli.run import decoding_overrides
    from diag.run.shipped import DEFAULT_PROMPTS, DEMO, shipped
    from diag.run.case import Case, EvaluateSpec, ModelSpec, PromptSpec, check_case, read_case
    prompts = str(Path(a.prompts).expanduser().resolve()) if a.prompts else None
    if a.case:
        case = read_case(a.case)
        case = replace(case, target=replace(case.target, path=a.target)) if a.target else case
    elif a.target:                      # the drafter is not read by a probe; the target stands in for it
        case = Case(version=1, name=Path(a.target.removeprefix("zoo:")).name or "probe", source="<flags>",
                    target=ModelSpec(a.target), drafter=ModelSpec(a.target),
                    prompts=PromptSpec(file=prompts or str(shipped(DEFAULT_PROMPTS).resolve()),
                                       max_new_tokens=64), evaluate=EvaluateSpec(scan=True))
    elif a.prompts:
        return None
    else:
        case = read_case(shipped(DEMO))
    pr = case.prompts
    pr = replace(pr, file=prompts or pr.file,
                 limit=a.limit if a.limit is not None else pr.limit,
                 max_new_tokens=pr.max_new_tokens if a.max_new_tokens is None else a.max_new_tokens)
    target = replace(case.target, trust_remote_code=case.target.trust_remote_code or a.trust_remote_code)
    return check_case(replace(case, prompts=pr, target=target, decoding=decoding_overrides(case.decoding, a)))


def _prompts_plan(a):
    from diag.cli.run import decoding_overrides
    from diag.engines.decoding import GREEDY, from_values
    from diag.probe.plan import from_prompts
    from diag.run.case import DecodingSpec
    dec = decoding_overrides(DecodingSpec(), a)
    given = bool(dec.temperature or dec.top_p or dec.top_k)
    decoding = from_values({"temperature": (dec.temperature or (1.0,))[0], "top_p": (dec.top_p or (1.0,))[0],
                            "top_k": (dec.top_k or (-1,))[0]}) if given else GREEDY
    n = 64 if a.max_new_tokens is None else a.max_new_tokens
    return from_prompts(str(Path(a.prompts).expanduser()), limit=a.limit, max_new_tokens=n, decoding=decoding,
                        decoding_source="flags" if given else "default (greedy)")


def _print(result) -> None:
    print(f"{result.server.engine} {result.server.version or ''} at {result.server.url}, model "
          f"{result.model}: {result.requests} requests in {result.wall_s:.1f} s")
    for note in result.notes:
        print(f"  note: {note}")
    print(f"saved: {result.out}  (probe.json lists what was sent)")
    if result.files:
        print("replay with: diag run CASE " + " ".join(result.run_flags()))


def _detected(client, engine: str | None):
    """The server, asked and checked before any prompt is read or tokenizer loaded."""
    from diag.probe.detect import check_engine, detect
    server = detect(client)
    check_engine(server, engine)
    return server


def probe_case(case, url: str, out: Path, *, engine: str | None = None, progress: bool = True,
               timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
               concurrency: int = DEFAULT_CONCURRENCY):
    """Probe `url` with the case's prompts into `out`; the case with [server] pointing at the files."""
    from diag.probe.client import Client
    from diag.probe.plan import from_case
    from diag.probe.probe import probe
    from diag.report.outdir import check_out_dir
    check_out_dir(out)
    client = Client(url, timeout=timeout, retries=retries)
    server = _detected(client, engine)
    result = probe(from_case(case), client, out, engine=engine, concurrency=concurrency, progress=progress,
                   server=server)
    _print(result)
    return replace(case, server=replace(case.server, **result.files)), result


def probe_for_run(case, a, out: Path):
    """`diag run CASE --server URL`: probe into OUT-server/, then the case reads those files."""
    from diag.engines import family_rules
    # the files a probe saves, by the `diag run` flag that reads each (every family's LiveServer.run_flags;
    # a flag's dest is server_<ServerSpec field>, cli/run.py SERVER_FLAGS)
    saved = {flag: f"server_{field}" for family in families()
             for field, flag in family_rules(family).live_server().run_flags.items()}
    given = [flag for flag, dest in saved.items() if getattr(a, dest, None)]
    if given:
        raise DiagError("--server probes the live server; saved server files cannot be given with it",
                        field="--server", expected="--server URL, or saved files (--server-responses ...)",
                        found=f"both: --server and {', '.join(given)}")
    return probe_case(case, a.server, Path(f"{out}-server"), engine=_served(getattr(a, "engine", None)),
                      progress=not a.quiet)[0]


def _served(name: str | list[str] | None) -> str | None:
    """`diag run --engine A --engine B --server URL`: the server runs the first engine named."""
    return name[0] if isinstance(name, list) and name else (name or None)


def run(a) -> int:
    from diag.probe.client import Client
    from diag.probe.plan import from_case
    from diag.probe.probe import probe
    from diag.report.outdir import check_out_dir
    if a.limit is not None and a.limit < 1:
        raise DiagError("--limit must be at least 1", field="--limit", expected=">= 1", found=a.limit)
    client = Client(a.server, timeout=a.timeout, retries=a.retries)
    case = _case(a)
    host = client.base.split("://", 1)[1].replace(":", "-").replace("/", "-")
    out = Path(a.out).expanduser() if a.out else Path("reports") / f"{case.name if case else 'probe-' + host}-server"
    check_out_dir(out)
    server = _detected(client, a.engine)
    plan = from_case(case) if case is not None else _prompts_plan(a)
    _print(probe(plan, client, out, engine=a.engine, model=a.model, concurrency=a.concurrency,
                 progress=not a.quiet, server=server))
    return 0
