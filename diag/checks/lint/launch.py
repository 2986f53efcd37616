"""Lint checks of the launch line: the tree flags SGLang rewrites or crashes on, and
max_running_requests in speculative mode.

Each check takes the Pair (pair.py) and returns Findings.
"""

from __future__ import annotations

from diag.checks.lint.pair import Finding, Pair
from diag.engines import rules


def check_tree(p: Pair) -> list[Finding]:
    if p.eff is None or p.eff.tree is None:
        return []
    tree, flag = p.eff.tree, "--speculative-num-draft-tokens"
    if tree.crash is not None:
        return [Finding("error", "TREE_CRASH", f"tree flags {tree.requested} (S, K, D) fail",
                        tree.crash, "pass all three flags with D - 1 <= K + (S-1)K^2, or none",
                        None, flag)]
    sev = "warning" if tree.requested != (None, None, None) else "info"
    shape = tree.shape
    wasted = [Finding("warning", "TREE_WASTED_STEPS", f"{shape.name} verifies {shape.num_draft_tokens - 1} "
                      f"token(s) per round but drafts {shape.num_steps} steps",
                      f"{shape.wasted_steps} draft step(s) per round are never verified (a node at depth j "
                      "needs its whole path in the verify tree)",
                      f"--speculative-num-steps {shape.num_draft_tokens - 1}, or --speculative-num-draft-tokens "
                      f"{shape.num_steps + 1}", None, "--speculative-num-steps")] if shape.wasted_steps else []
    fix = (f"to verify more than {shape.num_draft_tokens - 1} draft token(s) per round use "
           f"topk > 1 (a tree) or more steps; otherwise pass num_draft_tokens = "
           f"{shape.num_steps + 1} so the flags say what runs" if sev == "warning" else
           "pass all three tree flags to pin the shape")
    return [Finding(sev, "TREE_REWRITE" if sev == "warning" else "TREE_AUTO", note,
                    f"{rules(p.engine).display} runs {shape.name} (S={shape.num_steps}, K={shape.topk}, "
                    f"D={shape.num_draft_tokens})", fix, None, flag) for note in tree.notes] + wasted


def check_max_running(p: Pair) -> list[Finding]:
    if p.eff is None or p.eff.tree is None or p.flags.max_running_requests is not None:
        return []
    return [Finding("warning", "MAX_RUNNING_REQUESTS", "--max-running-requests not given in "
                    "speculative mode", " ".join(n for n in p.eff.notes if "max-running" in n
                                                 or "DP workers" in n),
                    "pass --max-running-requests sized for your load", None,
                    "--max-running-requests")]
