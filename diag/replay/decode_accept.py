"""The decode loop's accept (replay/decode_loop.py): each tree's rows accepted as that tree's own loop
accepts them (its D + 1 coins, its nodes only) by the engine's sampled rule (replay/verifiers.py),
on growing widths by accept_round, on fixed widths by accept_dense replayed from the loop's CUDA
graphs (`by_graph`), and the share of rows those graphs sort whole, widened after undone rounds
(`widen`). This module knows the rule and the rows; nothing about the target's cache, the drafter
or files.
"""

from __future__ import annotations

from typing import Callable

import torch

from diag.engines.decoding import Decoding
from diag.replay.accept import accept_dense, accept_round
from diag.replay.decode_rows import logits_part
from diag.replay.sampling import DEEPER_ROWS, SampledRound, coins_at
from diag.target.tree_forward import NodeLogits
from diag.trees import TreeShape

DEEPER_WIDEN = 4                     # an undone round widens the accept graph's rows sorted whole this many times,
WIDEN_MIN_UNDONE = 2                 # ... once at least this many rounds were undone
WIDEN_UNDONE_SHARE = 0.25            # ... and at least this share of the rounds so far


class AcceptSide:
    """The loop's accept. rule: the engine's sampled rule; trees, S: the loop's tree shapes and
    deepest path; counts: the loop's counts (shared: rounds read, undone rounds and widenings
    written); graphs(): the run's graphs by step; by_graph: DecodeLoop._by_graph; dense(): the
    round's shapes fixed; groups(lane_of, by_tree): DraftSide.groups. `deeper`: the share of rows
    the accept graphs sort whole (`widen`)."""

    def __init__(self, rule, decoding: Decoding, trees: list[TreeShape], S: int, dev, counts,
                 graphs: Callable, by_graph: Callable, dense: Callable, groups: Callable):
        self.rule, self.decoding, self.trees, self.S, self.dev, self.counts = rule, decoding, trees, S, dev, counts
        self.graphs, self.by_graph, self.dense, self.groups = graphs, by_graph, dense, groups
        self.deeper = DEEPER_ROWS

    def widen(self) -> None:
        """After an undone round (a top-p pivot past what the accept graph searched), once rounds
        are undone often (at least WIDEN_MIN_UNDONE, and WIDEN_UNDONE_SHARE of the rounds so far),
        the graphs captured from here on sort DEEPER_WIDEN times the share of rows whole (1/16 ->
        1/4 -> all, where a pivot is always found), and the old accept graphs are dropped: a target
        whose T=1 distribution is often flat past the window (more rows than the share) would
        otherwise run every round twice, while a rare undone round costs less than sorting more
        rows in every round. A rule on counts: the same run widens the same way every time; what a
        round decodes is the rule's whichever share (`accept_dense`). Example, every row flat:
        rounds 1, 2, 3 undone, the share 1/16, then 1/4 after round 2, then 1 after round 3.
        Measured (H100, chain-1 on 16 rows, the bench's 2-layer Kimi-shaped target grown to 4 with
        layers that flattened it): 32.0 ms a round without it (every round undone), 11.5 with it
        (3 rounds of 47 undone), the same decode (reports/bench/NOTES.md, twenty-fifth stop)."""
        undone = self.counts["accept_pivots_deeper"]
        often = undone >= WIDEN_MIN_UNDONE and undone >= WIDEN_UNDONE_SHARE * self.counts["rounds"]
        if self.deeper >= 1.0 or not often:
            return
        self.deeper = min(1.0, self.deeper * DEEPER_WIDEN)
        self.counts["accept_deeper_widened"] += 1
        graphs = self.graphs().get("accept")
        if graphs is not None:
            graphs.graphs.clear()

    def accept(self, st, t, scored, exact: bool = False):
        """Each tree's rows accepted as that tree's own loop accepts them (its D + 1 coins, its
        nodes only): (the round's result over all rows, path padded with -1 to S + 1; each row's
        P(a >= d) for its own depths [B, S], zero past them; ok, a 0-dim bool on the device, False
        where a graph's top-p pivot lay past its window, or None where every accept was exact).
        exact: no graph (DecodeLoop._round's second try)."""
        root = st.root_on(self.dev)
        if len(self.trees) == 1:
            return self._group(st, t, scored, self.trees[0], slice(0, len(st.n)), root, exact)
        B = len(st.n)
        accepted = torch.zeros(B, dtype=torch.long, device=self.dev)
        path = torch.full((B, self.S + 1), -1, dtype=torch.long, device=self.dev)
        bonus = torch.zeros(B, dtype=torch.long, device=self.dev)
        exp = torch.zeros(B, self.S, device=self.dev)
        ok = None
        for _, _, shape, sl in self.groups(st.lane_of, by_tree=True):
            res, e, good = self._group(st, t, scored, shape, sl, root, exact)
            accepted[sl], bonus[sl] = res.accepted.to(self.dev), res.bonus.to(self.dev)
            path[sl, :shape.num_steps + 1] = res.path.to(self.dev)
            exp[sl, :shape.num_steps] = e.to(self.dev)
            if good is not None:
                ok = good if ok is None else ok & good
        return SampledRound(accepted, path, bonus), exp, ok

    def _group(self, st, t, scored, shape: TreeShape, sl: slice, root, exact: bool):
        """The rows `sl` of one tree accepted: (SampledRound, P(a >= d) [R, S], ok) as `accept`.
        On growing widths (the CPU's) by accept_round, the head only at the nodes read; on fixed
        widths by accept_dense, replayed from a graph per (tree, rows) where the loop has them (its
        shapes depend on no draft; ok then says whether every top-p pivot lay within the window
        the graph searched), else, or `exact`, run without the graph."""
        D, S = shape.num_draft_tokens, shape.num_steps
        part = {k: v[sl, :D] for k, v in t.items()}
        logits = logits_part(scored.logits, sl, D)
        if not self.dense() or not isinstance(logits, NodeLogits):
            coins = coins_at(st.coin_row[sl], root[sl], D + 1)
            return (*accept_round(self.rule, part, logits, self.decoding, coins, S), None)

        def forward(x: dict, unsynced: bool = True) -> dict:
            coins = coins_at(x["coin_row"], x["root"], D + 1)
            res, exp, ok = accept_dense(self.rule, x, NodeLogits(logits.model, x["final"]), self.decoding, coins, S,
                                        unsynced=unsynced, deeper=self.deeper)
            out = {"accepted": res.accepted, "path": res.path, "bonus": res.bonus, "exp": exp}
            return {**out, "ok": ok} if unsynced else out
        x = {**part, "coin_row": st.coin_row[sl], "root": root[sl], "final": logits.final}
        got = None
        if exact and "accept" in self.graphs():
            self.graphs()["accept"].counts["eager"] += 1
        elif not exact:
            key = (shape.name, sl.start, sl.stop, self.deeper)
            got = self.by_graph("accept", logits.model, st.dkv.identity(), x, key, forward)
        ok = got["ok"] if got is not None else None
        got = got or forward(x, unsynced=False)
        return SampledRound(got["accepted"], got["path"], got["bonus"]), got["exp"], ok
