"""`diag explain`: reconcile a server log's accept len and accept rate.

Usage: diag explain --accept-len 1.68 --accept-rate 0.84
         [--num-steps 1 --topk 1 --num-draft-tokens 16] [--arch-family llama] [--engine sglang-0.5.23]
Prints which num_draft_tokens and which SGLang rate formula fit the two logged
numbers, which SGLang releases log that formula, whether the version given with --engine
does, and what the launch flags (if given) made SGLang actually run.
Exit status 0 when some (D, formula) fits (and, with --engine, that version's formula), 1
otherwise.
"""

from __future__ import annotations

import json

from diag.engines.sglang.explain import Explanation, explain


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "explain", help="reconcile a server log's accept len and accept rate",
        description="Find the num_draft_tokens and rate formula that make SGLang's logged "
                    "'accept len' and 'accept rate' consistent.")
    p.add_argument("--accept-len", type=float, required=True, help="logged accept len, e.g. 1.68")
    p.add_argument("--accept-rate", type=float, required=True, help="logged accept rate, e.g. 0.84")
    p.add_argument("--num-steps", type=int, default=None, help="--speculative-num-steps as launched")
    p.add_argument("--topk", type=int, default=None, help="--speculative-eagle-topk as launched")
    p.add_argument("--num-draft-tokens", type=int, default=None,
                   help="--speculative-num-draft-tokens as launched")
    p.add_argument("--architecture", default=None,
                   help="the target's architectures[0], for SGLang's auto tree defaults when no flag "
                        "was given (default LlamaForCausalLM)")
    p.add_argument("--arch-family", choices=["llama", "deepseek"], default=None,
                   help="shorthand: llama = LlamaForCausalLM, deepseek = DeepseekV3ForCausalLM")
    p.add_argument("--engine", default=None, help="the SGLang version you believe the server runs, "
                   "e.g. sglang-0.5.23; diag says whether the logged numbers fit it")
    p.add_argument("--decimals", type=int, default=2, help="decimals the log printed (default 2)")
    p.add_argument("--json", action="store_true", help="print JSON instead of sentences")
    p.set_defaults(func=run)


def as_dict(e: Explanation) -> dict:
    shape = e.resolved.shape if e.resolved is not None else None
    return {
        "accept_len": e.accept_len, "accept_rate": e.accept_rate,
        "consistent": [{"num_draft_tokens": d, "formula": f} for d, f in e.consistent],
        "flags": None if e.flags is None else dict(zip(
            ("num_steps", "topk", "num_draft_tokens"), e.flags)),
        "runs": None if shape is None else {"num_steps": shape.num_steps, "topk": shape.topk,
                                            "num_draft_tokens": shape.num_draft_tokens},
        "crash": None if e.resolved is None else e.resolved.crash,
        "implied": [{"num_draft_tokens": d, "formula": f} for d, f in e.implied],
        "versions": list(e.versions), "engine": e.engine, "engine_fits": e.engine_fits,
        "sentences": list(e.sentences),
    }


_FAMILY_ARCH = {"llama": "LlamaForCausalLM", "deepseek": "DeepseekV3ForCausalLM"}


def _architecture(args) -> str:
    return args.architecture or _FAMILY_ARCH[args.arch_family or "llama"]


def run(args) -> int:
    e = explain(args.accept_len, args.accept_rate, num_steps=args.num_steps, topk=args.topk,
                num_draft_tokens=args.num_draft_tokens, architecture=_architecture(args),
                decimals=args.decimals, engine_name=args.engine)
    if args.json:
        print(json.dumps(as_dict(e), indent=2, ensure_ascii=False))
    else:
        print("\n".join(e.sentences))
    return 0 if e.consistent and e.engine_fits is not False else 1
