"""The drafter's side of the decode loop (replay/decode_loop.py): the draft head each serving mode
drafts with, the rows grouped by mode and tree (`groups`), the features each row's layout reads
(`_aux_plan`, `_aux`), the round's trees (`draft`) and the drafter's cache extended with what a
round committed (`extend`), each replayed from the loop's CUDA graphs where it can (`by_graph`:
the loop's, which knows the run's graphs). Rows are sorted by mode, then tree, so each group is
one slice of the batch: the drafter's cache is viewed, never copied. This module knows the
drafter and the rows; nothing about the target, the accept rule or files.
"""

from __future__ import annotations

from typing import Callable

import torch

from diag.drafter.drafting import DraftHead
from diag.drafter.incremental import DraftKV, draft_tree, extend
from diag.layouts import CapturePoint, Layout, union_points
from diag.replay.decode_rows import Lane, Rows, at_nodes, resident_on, to_device
from diag.replay.replay import default_tables, draft_head
from diag.trees import TreeShape

DRAFT_FIELDS = ("tokens", "parents", "depths", "valid")     # what a round reads of a drafted tree


class DraftSide:
    """The lanes' drafting: `heads` (mode -> DraftHead, the engine's tables: replay.draft_head),
    `points` (every captured point the lanes read, and the final one), each lane's points and mode.
    by_graph(name, model, buffers, x, key, forward, allowed) is the loop's graph runner
    (DecodeLoop._by_graph): the step's outputs from a graph, or None to run it eagerly."""

    def __init__(self, drafter, embed, head, lanes: list[Lane], layouts: dict[str, Layout],
                 trees: list[TreeShape], lane_tree: list[int], tables: dict | None, by_graph: Callable):
        self.drafter, self.trees, self.lane_tree, self.by_graph = drafter, trees, lane_tree, by_graph
        self.D = max(t.num_draft_tokens for t in trees)                     # the verify's nodes a row
        p = next(drafter.parameters())
        self.dev, self.dtype = p.device, p.dtype
        # a draft's graph reads its tables where they live: only where both are on the drafter's device
        self.tables_here = all(resident_on(m, self.dev) for m in (embed, head))
        self.heads = {m: draft_head(drafter, embed, head, (tables or {}).get(m) or default_tables(drafter, m),
                                    self.dev, self.dtype)
                      for m in dict.fromkeys(ln.variant.mode for ln in lanes)}
        lays = [layouts[ln.variant.layout] for ln in lanes if ln.variant.mode == "eagle3"]
        self.points = tuple(dict.fromkeys(union_points(lays) + (CapturePoint("final"),)))
        self.lane_points = [("final",) if ln.variant.mode == "eagle" else
                            tuple(p.name for p in layouts[ln.variant.layout].points) for ln in lanes]
        self.lane_mode = [ln.variant.mode for ln in lanes]
        self._plans: dict[tuple[int, int], tuple] = {}    # (rows) -> (the lane_of it was built for, plan)

    def groups(self, lane_of: torch.Tensor, by_tree: bool = False) -> list[tuple[str, DraftHead, TreeShape | None, slice]]:
        """(mode, its draft head, tree, its rows) for every mode present (by_tree: every mode and
        tree; else tree None): rows are sorted by mode, then tree, and stay so when rows leave, so
        each group is one slice (drafter-cache views, no copies)."""
        lanes = lane_of.tolist()
        out = []
        for mode, head in self.heads.items():
            for k, tree in enumerate(self.trees if by_tree else [None]):
                idx = [i for i, li in enumerate(lanes)
                       if self.lane_mode[li] == mode and (tree is None or self.lane_tree[li] == k)]
                if idx:
                    out.append((mode, head, tree, slice(idx[0], idx[-1] + 1)))
        return out

    def _aux_plan(self, lane_of: torch.Tensor, rows: slice) -> list[tuple[tuple[str, ...], torch.Tensor, torch.Tensor | None]]:
        """How the rows `rows` read their features: per layout among them, (its points, its rows'
        indices in the batch, their places among `rows`; None when it is every row). Index
        tensors on the device, built on the host once for each batch of rows (lane_of changes only
        where rows retire; a graph then reads them as inputs: no boolean mask asks the device how
        many rows it holds, and no round copies them again). Example: rows 0..5, lanes
        [a, a, b, b, a, b] -> (a's points, [0, 1, 4], [0, 1, 4]), (b's points, [2, 3, 5], [2, 3, 5])."""
        got = self._plans.get((rows.start, rows.stop))
        if got is not None and got[0] is lane_of:
            return got[1]
        sub = lane_of[rows].tolist()
        plan = []
        for pts in dict.fromkeys(self.lane_points[li] for li in sub):
            at = [i for i, li in enumerate(sub) if self.lane_points[li] == pts]
            full = to_device(torch.tensor([rows.start + i for i in at], dtype=torch.long), self.dev)
            plan.append((pts, full, None if len(at) == len(sub) else to_device(torch.tensor(at, dtype=torch.long), self.dev)))
        self._plans[(rows.start, rows.stop)] = (lane_of, plan)
        return plan

    def _aux(self, picked: dict[str, torch.Tensor], plan, rows: int) -> torch.Tensor:
        """[R, N, W] features of R rows by each row's layout (`_aux_plan`); picked: every captured
        point's [B, N, H] rows of the batch."""
        out = None
        for pts, full, at in plan:
            feats = torch.cat([picked[p][full] for p in pts], -1).to(self.dev, self.dtype)
            if at is None:
                return feats
            if out is None:
                out = feats.new_zeros(rows, *feats.shape[1:])
            out.index_copy_(0, at, feats)
        return out

    def extend(self, st: Rows, states, pick, nxt, pos, count, node: torch.Tensor | None = None):
        """Append count[b] pairs to every row's drafter cache; r_root = r of each row's last pair.
        pick(t) maps a captured state to [B, N, H] rows; a commit instead gives `node` [B, N] (the
        path's nodes, whose states it reads), and its extend is then replayed from a graph per
        (mode, rows, N) where the loop has them: its shapes are fixed on fixed widths (N = S + 1)."""
        B = len(st.lane_of)
        r_all = None
        for mode, head, _, sl in self.groups(st.lane_of):
            plan, sub = self._aux_plan(st.lane_of, sl), st.dkv.select(sl)
            needed = list(dict.fromkeys(p for pts, _, _ in plan for p in pts))

            def forward(x: dict, head=head, plan=plan, sub=sub, needed=needed, rows=sl.stop - sl.start) -> dict:
                picked = {p: at_nodes(x[f"state:{p}"], x["node"]) if "node" in x else pick(states[p])
                          for p in needed}
                plan = [(pts, x[f"full:{i}"], x.get(f"at:{i}")) for i, (pts, _, _) in enumerate(plan)]
                kv = DraftKV(sub.k, sub.v, x["length"])
                r = extend(self.drafter, head, kv, x["nxt"], self._aux(picked, plan, rows), x["pos"], x["count"])
                return {"r": r, "length": kv.length}
            x = {"length": sub.length, "nxt": nxt[sl], "pos": pos[sl], "count": count[sl]}
            for i, (_, full, at) in enumerate(plan):
                x[f"full:{i}"] = full
                if at is not None:
                    x[f"at:{i}"] = at
            got = None
            if node is not None:
                x.update({"node": node, **{f"state:{p}": states[p] for p in needed}})
                got = self.by_graph("extend", self.drafter, st.dkv.identity(), x,
                                     (mode, sl.start, sl.stop, nxt.shape[1]), forward, allowed=self.tables_here)
            got = got or forward(x)
            sub.length = got["length"]
            st.dkv.put(sl, sub)
            if r_all is None:
                r_all = got["r"].new_zeros(B, *got["r"].shape[1:])
            r_all[sl] = got["r"]
        st.r_root = r_all                                    # each row's last pair's step-1 output

    def draft(self, st, root: torch.Tensor | None = None, root_tok: torch.Tensor | None = None):
        """The round's trees, {tokens, parents, depths, valid} [B, D], from each row's root j and
        root token (read from the host's seq unless given, on the device: a draft queued ahead)."""
        root = st.root_on(self.dev) if root is None else root
        root_tok = self.root_tokens(st) if root_tok is None else root_tok
        B, D = len(st.n), self.D
        groups = self.groups(st.lane_of, by_tree=True)
        if len(groups) == 1 and groups[0][2].num_draft_tokens == D:      # one tree over every row: as drafted
            mode, head, shape, sl = groups[0]
            return self._draft_group(st, (mode, shape.name, sl.start, sl.stop), head, shape, sl, root, root_tok)
        full = {k: torch.zeros(B, D, dtype=t, device=self.dev)          # a smaller tree's tail: invalid
                for k, t in (("tokens", torch.long), ("parents", torch.long), ("depths", torch.long),
                             ("valid", torch.bool))}
        for mode, head, shape, sl in groups:
            tree = self._draft_group(st, (mode, shape.name, sl.start, sl.stop), head, shape, sl, root[sl], root_tok[sl])
            for k in full:
                full[k][sl, :shape.num_draft_tokens] = tree[k].to(self.dev)
        return full

    def root_tokens(self, st) -> torch.Tensor:
        """[B] each row's root token, the last id in the host's seq, on the device."""
        return to_device(st.seq[torch.arange(len(st.n)), st.n - 1], self.dev)

    def _draft_group(self, st, key: tuple, head, shape, sl: slice, root, root_tok) -> dict:
        """The trees of the rows `sl` ({tokens, parents, depths, valid} [R, D]). The draft's shapes
        are fixed while its rows stay (the drafter's cache is a buffer of fixed capacity,
        incremental.DraftKV), so where the loop has graphs it is replayed from one per group `key`
        on the cache's buffers (target/verify_graphs.py), its inputs the rows' lengths, roots and
        step-1 outputs; else drafted eagerly: the same numbers. Not where the embedding or head
        sits on another device (a multi-GPU placement's first and last stage) or reads on the
        host (target/tables.py): a copy between devices inside a capture would not be recorded."""
        kv = st.dkv.select(sl)

        def forward(x: dict) -> dict:
            tree = draft_tree(self.drafter, head, DraftKV(kv.k, kv.v, x["length"]), x["r_root"], x["root"],
                              x["root_tokens"], shape)
            return {k: getattr(tree, k) for k in DRAFT_FIELDS}
        x = {"length": kv.length, "r_root": st.r_root[sl], "root": root, "root_tokens": root_tok}
        return self.by_graph("draft", self.drafter, st.dkv.identity(), x, key, forward,
                              allowed=self.tables_here) or forward(x)
