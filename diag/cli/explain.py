"""`diag explain`: reconcile a server log's accept len and accept rate.

Usage: diag explain --accept-len 1.68 --accept-rate 0.84
         [--num-steps 1 --topk 1 --num-draft-tokens 16] [--arch-family llama] [--engine sglang-0.5.23]
       diag explain --engine NAME --metrics metrics.txt | --server-log server.log
         (the engine's own counters: drafts, accepted, per position -> accept length and rates)
Prints which num_draft_tokens and which SGLang rate formula fit the two logged
numbers, which SGLang releases log that formula, whether the version given with --engine
does, and what the launch flags (if given) made SGLang actually run.
Exit status 0 when some (D, formula) fits (and, with --engine, that version's formula), 1
otherwise.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from diag.engines import DEFAULT_ENGINE, engine, rules as engine_rules
from diag.errors import DiagError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "explain", help="reconcile a server log's accept len and accept rate",
        description="Find the num_draft_tokens and rate formula that make a server's logged "
                    "'accept len' and 'accept rate' consistent, by the rules of --engine's family.")
    p.add_argument("--accept-len", type=float, default=None, help="logged accept len, e.g. 1.68")
    p.add_argument("--accept-rate", type=float, default=None, help="logged accept rate, e.g. 0.84")
    p.add_argument("--metrics", default=None, help="a saved GET /metrics of the server: reconcile its "
                   "speculative counters with the rules of --engine (an engine that exports them)")
    p.add_argument("--server-log", default=None, help="a saved server log: reconcile its speculative metric "
                   "lines with the rules of --engine (an engine that logs counters)")
    p.add_argument("--num-steps", type=int, default=None, help="--speculative-num-steps as launched")
    p.add_argument("--topk", type=int, default=None, help="--speculative-eagle-topk as launched")
    p.add_argument("--num-draft-tokens", type=int, default=None,
                   help="--speculative-num-draft-tokens as launched")
    p.add_argument("--architecture", default=None,
                   help="the target's architectures[0], for the engine's auto tree defaults when no flag "
                        "was given (default LlamaForCausalLM)")
    p.add_argument("--arch-family", choices=["llama", "deepseek"], default=None,
                   help="shorthand: llama = LlamaForCausalLM, deepseek = DeepseekV3ForCausalLM")
    p.add_argument("--engine", default=None, help="the engine release you believe the server runs, "
                   f"<family>-<version>, e.g. {DEFAULT_ENGINE}; diag says whether the logged numbers fit it "
                   "(default: its family's rules, no release checked)")
    p.add_argument("--decimals", type=int, default=2, help="decimals the log printed (default 2)")
    p.add_argument("--json", action="store_true", help="print JSON instead of sentences")
    p.set_defaults(func=run)


_FAMILY_ARCH = {"llama": "LlamaForCausalLM", "deepseek": "DeepseekV3ForCausalLM"}


def _architecture(args) -> str:
    return args.architecture or _FAMILY_ARCH[args.arch_family or "llama"]


def _counters(args) -> int:
    """--metrics / --server-log: the engine named by --engine reconciles its own counters."""
    path = args.metrics or args.server_log
    rules, release = engine_rules(args.engine), engine(args.engine)
    reconcile = getattr(rules, "explain_counters", None)
    try:
        if reconcile is None:
            raise DiagError(f"{rules.display} exports no counters diag reconciles", field="--engine",
                            expected="an engine whose metrics or log lines carry draft / accepted counts",
                            found=release.label, hint="give --accept-len and --accept-rate from its log")
        e = reconcile(Path(path).read_text(), source=path, release=release,
                      kind="metrics" if args.metrics else "log")
    except (DiagError, OSError) as err:
        print(err.render() if isinstance(err, DiagError) else f"cannot read {path}: {err}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(e), indent=2, ensure_ascii=False) if args.json else "\n".join(e.sentences))
    return 0 if e.consistent else 1


def run(args) -> int:
    if args.metrics or args.server_log:
        return _counters(args)
    if args.accept_len is None or args.accept_rate is None:
        print("diag explain: give --accept-len and --accept-rate (or --metrics / --server-log)", file=sys.stderr)
        return 2
    e = engine_rules(args.engine).explain_logged(
        args.accept_len, args.accept_rate, num_steps=args.num_steps, topk=args.topk,
        num_draft_tokens=args.num_draft_tokens, architecture=_architecture(args), decimals=args.decimals,
        release=engine(args.engine) if args.engine is not None else None)
    if args.json:
        print(json.dumps(e.to_json(), indent=2, ensure_ascii=False))
    else:
        print("\n".join(e.sentences))
    return 0 if e.consistent and e.engine_fits is not False else 1
