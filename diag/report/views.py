"""What the report's first screen shows, read from the report dict: the rows of the primary
tree (every candidate layout and serving mode at the run's reference regime) and a short tag
for each. The terminal summary and report.md both call these, so they show the same rows.

Worked example (the demo): reference tree chain-3, regime as-loaded -> rows
`embed+L2+L4` eagle3, `L1+L3+L5` eagle3 (tag "served"), `final (EAGLE)` eagle (tag "if
served with EAGLE"), best first. This module reads report dicts; it computes no metric.
"""

from __future__ import annotations

import json

from diag.replay.evaluation import ANY, Evaluation, reference_axes, select


def primary_tree(rep: dict) -> str | None:
    return (rep.get("reference") or {}).get("tree")


def regime_label(e: dict) -> str:
    """as-loaded; a cross-regime variant reads w4a16-g32→as-loaded."""
    return e["regime"] if e["regime"] == e["tokens_regime"] else f"{e['regime']}→{e['tokens_regime']}"


def variant_label(e: dict) -> str:
    """A variant without its tree: `embed+L2+L4` eagle3 as-loaded."""
    return f"{e['layout']} {e['mode']} {regime_label(e)}"


def served(rep: dict) -> list[dict]:
    """The greedy evaluation dicts under the serving rendering: the other renderings are the
    renderings section's, the sampled decodings the decoding section's (decoding_section.py)."""
    at = (rep.get("reference") or {}).get("rendering")
    return [e for e in rep.get("evaluations", []) if (at is None or e.get("rendering", at) == at)
            and e.get("decoding", "greedy") == "greedy"]


def _accept_key(e: dict) -> float:
    return -(e["accept_length"] if e["accept_length"] is not None else -1.0)


def primary_rows(rep: dict) -> list[dict]:
    """Evaluation dicts on the primary tree at the reference regime, any layout and mode,
    highest accept length first (variants without rounds last)."""
    where = reference_axes(rep).but(layout=ANY, mode=ANY)
    keys = {e.key for e in select([Evaluation.from_json(e) for e in rep.get("evaluations", [])], where)}
    return sorted((e for e in rep.get("evaluations", []) if e["key"] in keys), key=_accept_key)


def tag(rep: dict, e: dict) -> str:
    """What the row is to the deployment: "served", "declared", "if served with EAGLE", or ""."""
    roles = next((c["roles"] for c in rep.get("candidates", []) if c["label"] == e["layout"]), [])
    if "serving" in roles:
        return "served"
    if e["mode"] == "eagle":
        return "if served with EAGLE"
    if any(r.startswith("declared") for r in roles):
        return "declared"
    return ""


def tree_order(rep: dict) -> list[str]:
    """Evaluated tree names by (num_steps, topk, num_draft_tokens): chain-1, chain-2, ..."""
    shapes = {e["tree"]: (e["num_steps"], e["topk"], e["num_draft_tokens"]) for e in served(rep)}
    return sorted(shapes, key=lambda t: shapes[t])


def plot_link(rep: dict, name: str) -> list[str]:
    """The Markdown image line of plot `name` (e.g. "by_position.png"), or nothing."""
    return [f"![{p['title']}]({p['file']})" for p in rep.get("plots") or [] if p["file"] == f"plots/{name}"]


def quoted(text: str | None) -> str:
    """A decoded token run as a code span, newlines and tabs visible: "a\\nb" -> `a\\nb`."""
    if text is None:
        return "–"
    return "`" + json.dumps(text)[1:-1].replace("`", "'").replace("|", "\\|") + "`"
