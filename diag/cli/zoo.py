"""`diag zoo`: list, build and locate the tiny checkpoints diag builds itself.

    diag zoo list                 every entry, whether it is built, its build time and key metric
    diag zoo build [NAME ...]     build the named entries (default: all) and what they need
    diag zoo build --force NAME   delete NAME's cached copy first (its dependencies stay)
    diag zoo path NAME            print the directory (building it if needed)

This module knows argparse and the terminal; the work is in diag.zoo.
"""

from __future__ import annotations

import argparse
import sys

from diag.errors import DiagError


def register(subparsers) -> None:
    p = subparsers.add_parser("zoo", help="tiny real checkpoints for tests and demos (built on demand)",
                              description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="zoo_command", required=True, metavar="{list,build,path}")
    sub.add_parser("list", help="entries, built or not, with build time and quality")
    b = sub.add_parser("build", help="build entries (default: all) and their dependencies")
    b.add_argument("names", nargs="*", metavar="NAME")
    b.add_argument("--force", action="store_true", help="rebuild the named entries even if cached")
    pa = sub.add_parser("path", help="print an entry's directory, building it if needed")
    pa.add_argument("name", metavar="NAME")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        if args.zoo_command == "list":
            return _list()
        if args.zoo_command == "build":
            return _build(args.names, args.force)
        return _path(args.name)
    except DiagError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _headline(meta: dict | None) -> str:
    """One number that says whether the entry is any good."""
    if not meta:
        return ""
    m = meta.get("metrics", {})
    if "heldout_perplexity" in m:
        return f"held-out ppl {m['heldout_perplexity']:.1f}"
    if "greedy_chain" in m:
        return f"accept len {m['greedy_chain']['accept_length']:.2f} (chain 3)"
    if "train_tokens" in m:
        return f"{m['train_tokens']:,} train tokens"
    if "packed_linears" in m:
        return f"{m['packed_linears']} packed linears"
    return ""


def _list() -> int:
    from diag.zoo import ZOO, cache_root, is_built
    from diag.zoo.build import outdated, read_meta
    print(f"cache: {cache_root()}")
    stale = outdated(list(ZOO))
    for name, e in ZOO.items():
        meta = read_meta(name) if is_built(name) else None
        state = f"built {meta['seconds']:6.1f}s" if meta else ("built" if is_built(name) else "not built")
        if is_built(name) and name in stale:
            state = "stale (rebuilt on use)"
        print(f"  {name:26s} {state:14s} {_headline(meta):28s} {e.summary}")
    return 0


def _build(names: list[str], force: bool) -> int:
    from diag.zoo import ZOO
    from diag.zoo.build import closure, ensure, read_meta
    from diag.zoo.cache import remove
    wanted = names or list(ZOO)
    closure(wanted)                       # unknown names fail before anything is deleted
    if force:
        for n in wanted:
            remove(n)
    paths = ensure(wanted)
    for n in wanted:
        meta = read_meta(n)
        took = f"{meta['seconds']:.1f}s" if meta else "?"
        print(f"{n:26s} {took:>8s}  {paths[n]}")
    return 0


def _path(name: str) -> int:
    from diag.zoo import zoo_path
    print(zoo_path(name))
    return 0
