"""A speculative decode, round by round, as the server runs it (DESIGN.md §11).

Under sampling the continuation depends on the drafts, so no teacher-forced pass can score it.
Each round, for every row (a lane = variant x seed, times a prompt):
    draft      the drafter drafts a tree from the row's root (drafter/incremental.py)
    verify     the target scores the tree in one tree-attention forward (target/tree_forward.py)
    accept     SGLang's target-only rule with both thresholds, bonus from relu(p - excluded)
               (replay/accept.py, replay/sampling.py); greedy = the same walk over one-hot argmax
               probabilities
    commit     root + accepted nodes join the target's cache; their states and the new tokens
               extend the drafter's cache (`extend`); the next root is j + a + 1
On CUDA every step runs on fixed shapes (`_dense`: the whole cache buffer attended, every node
through the head, S + 1 pairs extended a row) and is replayed from CUDA graphs (GRAPHED), so a
round launches a handful of graphs, not ~2,000 kernels; the host reads the device once a round,
after the commit (the accept is committed before the host has read it: `_round`), and the next
round's draft and verify are queued before that read, so the device drafts and verifies while the
host updates its sequences.
Indices as in verify.py: a round rooted at j has the target's state at j, root token t_{j+1}
at position j + 1, depth d at position j + 1 + d. Worked example: prompt of 5 tokens ->
prefill, t_5 sampled from the state at 4, first round rooted at j = 4 (tree at positions 5..);
it accepts 2 -> emits t_6, t_7 (drafts) and t_8 (bonus); the next round is rooted at 7.

Rounds are recorded with their root, accepted count and the exact P(a >= d) of the round
(thresholds included). A row stops at an end-of-sequence token or once it has emitted
max_new_tokens, as generation does; `Decoded.rounds_counted` keeps the rounds the engine's
round accounting counts (replay/round_accounting.py), the rounds a teacher-forced replay of the
same sequence scores, so at T -> 0 both give the same rounds: "window" keeps roots up to
T - 2 - window_steps; "to-end" keeps every round the loop ran before the request ended, the
last one included when max_new_tokens cuts it (its drafts counted before the cut, as vLLM's
scheduler counts them). Worked example: prompt 5, max_new_tokens 6 (T 11), a chain of 3:
rounds rooted at 4 (a = 3: emits t_6..t_9) and 8 (a = 2: emits t_10, t_11, t_12, of which
t_11, t_12 lie past max_new_tokens) -> "to-end" counts both (2 rounds, Σa 5), "window" only
the first (root 8 > 11 - 2 - 3). Coins are keyed on (seed, prompt, root position), so
lanes that differ only in layout share their random numbers (a paired comparison), and a
row's draws do not depend on the batch. The drafter's side of a round (its heads, the rows'
groups, the draft and the extend) is replay/decode_draft.py, its accept replay/decode_accept.py, what
the loop carries between rounds replay/decode_rows.py. This module knows the loop; nothing about files.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace

import torch

from diag.drafter.incremental import DraftKV, cache_dims
from diag.engines.decoding import Decoding
from diag.int4.packed import dense_held
from diag.layouts import Layout
from diag.replay.accept import probabilities
from diag.replay.decode_accept import AcceptSide
from diag.replay.decode_draft import DraftSide
from diag.replay.decode_rows import (Ahead, Decoded, Lane, ReadBack, Rows, at_nodes, cpu_threads, retiring,
                                     to_device, to_host)
from diag.replay.sampling import coin_rows, sample, uniforms
from diag.replay.verifiers import sampled_rule
from diag.target.passes import pad_right
from diag.target.fused_norm import fused_norms, fused_wanted
from diag.target.mla_latent import latent_mla, latent_wanted
from diag.target.sdpa import attention_without_cudnn
from diag.target.kv_buffer import BufferLayer, stamps
from diag.target.tree_forward import (cache_bytes, cache_layers, commit, commit_fixed, crop_committed, prefill,
                                      rewind_verify, select_rows, verify_forward, verify_queued)
from diag.target.verify_graphs import VerifyGraphs, graphs_wanted
from diag.trees import TreeShape

FIRST_TOKEN_STREAM = 0x5BD1E995      # the prefill's sample draws from its own coin stream
GRAPHED = ("draft", "verify", "accept", "commit", "extend")   # a round's steps, each from CUDA graphs where it can
VERIFY_AHEAD_MAX_STEPS = 1           # the next verify is queued ahead of the read-back only for drafts this deep
                                     # (`_verify_ahead`; a deeper draft queued ahead already covers the read-back)





class DecodeLoop:
    """All lanes over the same prompts, batched; see the module docstring. Lanes may carry
    different tree shapes (each lane its variant's tree): every row drafts its own tree, the
    verify scores them all in one forward, the trees padded to the widest (padding nodes are
    invalid: no node sees them, none is accepted), and each tree's rows are accepted as a loop of
    that tree alone would accept them (its own D, coins and thresholds). Worked example: chain-1
    (D 2) and s3-k8-d16 lanes -> one verify of 16 nodes a row a round; the chain-1 rows' nodes
    2..15 are padding. `shape`, where given, is the one tree every lane must carry."""

    def __init__(self, model, drafter, embed, head, lanes: list[Lane], layouts: dict[str, Layout],
                 shape: TreeShape | None, decoding: Decoding, *, eos_ids: set[int], profile: bool | str = False,
                 tables: dict | None = None, verification: str = "tree-target-only"):
        self.model, self.drafter, self.lanes, self.layouts = model, drafter, lanes, layouts
        self.rule = sampled_rule(verification)     # the engine's sampled rule (replay/verifiers.py)
        self.profile, self.seconds = profile, defaultdict(float)     # phase -> seconds (profile only)
        self.fixed_width: bool | None = None       # the verify's attention on fixed widths (None: on CUDA)
        self.on_step = lambda: None                # called after the prefill and after every round
        self.graph_failures: dict[str, str] = {}  # a GRAPHED step -> why its graphs were turned off
        self.cuda_graphs = graphs_wanted()  # each GRAPHED step replayed from CUDA graphs where it can
        self.verify_ahead_steps = VERIFY_AHEAD_MAX_STEPS   # `_verify_ahead`: queued where S is at most this
        self.graphs: dict[str, VerifyGraphs] = {}  # this run's graphs by step (target/verify_graphs.py)
        self.target_steps: str | None = None   # the target's steps (verify, accept, commit) as placed (None:
                                   # VerifyGraphs.how), or forced on one device: "eager" (as diag ran a target over
                                   # several devices before programs), "program" (as it runs one now), the
                                   # drafter's steps graphed either way (bench/round_slope.split_probe)
        self.counts = defaultdict(int)                      # rounds, verified tokens, rows, kv bytes read
        self._blocks: dict[tuple, torch.Tensor] = {}        # the commit's block size on the device (`_commit_target`)
        self.decoding, self.eos = decoding, sorted(eos_ids)
        self.trees = list(dict.fromkeys(ln.variant.tree for ln in lanes))     # the loop's tree shapes
        if shape is not None and self.trees != [shape]:
            raise ValueError(f"DecodeLoop: the lanes carry trees {[t.name for t in self.trees]}, not {shape.name}")
        self.lane_tree = [self.trees.index(ln.variant.tree) for ln in lanes]
        self.D = max(t.num_draft_tokens for t in self.trees)                # the verify's nodes a row
        self.S = max(t.num_steps for t in self.trees)                       # the deepest path
        self.drafts = DraftSide(drafter, embed, head, lanes, layouts, self.trees, self.lane_tree, tables,
                                self._by_graph)             # the drafter's side: heads, groups, draft, extend
        self.dev, self.dtype, self.points = self.drafts.dev, self.drafts.dtype, self.drafts.points
        self.accepts = AcceptSide(self.rule, decoding, self.trees, self.S, self.dev, self.counts,     # the accept,
                                  lambda: self.graphs, self._by_graph, self._dense, self.drafts.groups)  # widened

    @contextmanager
    def _phase(self, name: str):
        """With profile=True, wall seconds of a phase (CUDA synchronised around it), and the
        phase named "diag.<name>" to torch.profiler (bench/sampled.round_profile reads it);
        with profile="ranges", only the name, nothing synchronised (bench/round_gaps.py)."""
        if not self.profile:
            yield
            return
        if self.profile == "ranges":
            with torch.profiler.record_function(f"diag.{name}"):
                yield
            return
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.profiler.record_function(f"diag.{name}"):
            yield
            if self.dev.type == "cuda":
                torch.cuda.synchronize()
        self.seconds[name] += time.perf_counter() - t0

    @torch.no_grad()
    def run(self, prompts: list[list[int]], rows: list[tuple[int, int]], max_new_tokens: int) -> list[Decoded]:
        """rows: (lane index, prompt index) pairs. Returns one Decoded per row, in order. Inside,
        rows are grouped by serving mode, then tree (one contiguous slice each, see `DraftSide.groups`). On the
        CPU an INT4 target's dequantized weights are kept for the loop (int4/packed.dense_held). On CUDA the
        whole loop runs without cuDNN's attention: the drafter's attention takes a new shape every
        round (its cache grows), and cuDNN would plan each one (target/sdpa.py); an MLA target
        attends over its latent cache there (target/mla_latent.py)."""
        modes = list(self.drafts.heads)
        order = sorted(range(len(rows)), key=lambda i: (modes.index(self.drafts.lane_mode[rows[i][0]]),
                                                        self.lane_tree[rows[i][0]]))
        with cpu_threads(self.dev), attention_without_cudnn(self.dev), dense_held(self.model), \
                fused_norms(self.model, fused_wanted(self.dev)), \
                latent_mla(self.model, latent_wanted(self.dev)) as switched:
            self.counts["mla_latent_layers"] = switched
            out = self._run([rows[i] for i in order], prompts, max_new_tokens)
        back = [None] * len(rows)
        for pos, i in enumerate(order):
            back[i] = out[pos]
        return back

    def _run(self, rows, prompts, max_new_tokens) -> list[Decoded]:
        on = self.cuda_graphs and self._graphs_possible()
        self.graphs = {name: VerifyGraphs() for name in GRAPHED} if on else {}
        for graphs in self.graphs.values() if self.target_steps else ():
            (graphs.eager_for if self.target_steps == "eager" else graphs.programmed_for)(self.model)
        try:
            return self._rounds(rows, prompts, max_new_tokens)
        finally:
            for name, graphs in self.graphs.items():   # what the run's graphs did, then their memory freed
                for k, v in graphs.counts.items():
                    self.counts[f"{name}_graphs_{k}"] += v
                if graphs.failure:
                    self.graph_failures[name] = graphs.failure
            self.graphs = {}

    def _dense(self) -> bool:
        """The round's shapes fixed (the verify's attention on the cache's whole buffer, every
        node through the head in the accept, the drafter's extend S + 1 pairs a row): on CUDA by
        default (`fixed_width`), where graphs replay them; the same numbers up to sums' rounding."""
        return self.dev.type == "cuda" if self.fixed_width is None else self.fixed_width

    def _by_graph(self, name: str, model, buffers: tuple, x: dict, key: tuple, forward,
                  allowed: bool = True) -> dict | None:
        """forward(x) replayed from the run's graphs of step `name` (VerifyGraphs.run, on the
        buffers `buffers` name), or None where the caller must run it eagerly (counted so): no
        graphs this run, `allowed` False, `model` off CUDA or its first parameter not on the loop's
        device, or a capture that failed (VerifyGraphs.how: a graph, or a program over devices)."""
        graphs = self.graphs.get(name)
        if graphs is None:
            return None
        got = None
        if allowed and graphs.usable(model) and next(model.parameters()).device == self.dev:
            got = graphs.run(buffers, x, key, forward, model=model)
        if got is None:
            graphs.counts["eager"] += 1
        return got

    def _graphs_possible(self) -> bool:
        """CUDA graphs exist on CUDA only (VerifyGraphs.usable then asks the model's placement)."""
        return self.dev.type == "cuda"

    def _rounds(self, rows, prompts, max_new_tokens) -> list[Decoded]:
        with self._phase("prefill"):
            st, tkv = self._start(prompts, rows, max_new_tokens)
        self.counts["rows"] += len(rows)
        self.on_step()
        while st.active.numel():
            self.counts["rounds"] += 1
            self.counts["verified_tokens"] += len(st.n) * self.D                 # the forward's nodes
            self._round(st, tkv)
            with self._phase("retire"):
                st = self._retire(st, tkv, prompts, max_new_tokens)
            self.on_step()
        return st.out

    # ---- prefill -----------------------------------------------------------------------
    def _start(self, prompts, rows, max_new_tokens):
        uniq = sorted({p for _, p in rows})
        ids, valid = pad_right([torch.tensor(prompts[p], dtype=torch.long) for p in uniq])
        cap = ids.shape[1] + max_new_tokens + 2 * (self.D + 2)
        tkv, scored = prefill(self.model, ids, valid, self.points, capacity=cap)
        pick = torch.tensor([uniq.index(p) for _, p in rows], dtype=torch.long)
        select_rows(tkv, pick)                                                # one cache row per row
        B, P = len(rows), ids.shape[1]
        plen = torch.tensor([len(prompts[p]) for _, p in rows], dtype=torch.long)
        lane_of = torch.tensor([li for li, _ in rows], dtype=torch.long)
        out = [Decoded(self.lanes[li], p) for li, p in rows]
        seq = torch.cat([ids[pick], torch.zeros(B, 1, dtype=torch.long)], dim=1)
        logits = scored.logits[:, 0].to(self.dev)[pick.to(self.dev)]
        keys = torch.tensor([o.prompt for o in out], dtype=torch.long, device=self.dev)     # each row's prompt
        seq[torch.arange(B), plen] = self._first_tokens(logits, keys, lane_of, plen).cpu()
        attn = self.drafter.midlayer.self_attn
        cap = P + max_new_tokens + 2 * (self.S + 2)
        heads, k_dim, v_dim = cache_dims(attn)
        dkv = DraftKV.empty(B, cap, heads, k_dim, dtype=self.dtype, device=self.dev, v_dim=v_dim)
        st = Rows(seq, plen + 1, None, dkv, lane_of, torch.arange(B), out, coin_rows(self._seeds(lane_of), keys),
                   torch.zeros(B, dtype=torch.bool))
        pos = torch.arange(P, device=self.dev).expand(B, P)
        self.drafts.extend(st, scored.states, lambda t: t[pick.to(t.device)], seq[:, 1:P + 1].to(self.dev), pos,
                     plen.to(self.dev))
        return st, tkv

    def _first_tokens(self, logits, keys, lane_of, plen):
        """t_P of every row, sampled from the prompt's last state with its own coin stream."""
        coins = uniforms(self._seeds(lane_of, FIRST_TOKEN_STREAM), keys, plen.to(self.dev), 1)
        return sample(probabilities(logits, self.decoding), coins[:, 0])

    def _seeds(self, lane_of, stream: int = 0) -> torch.Tensor:
        """[B] each row's lane seed ^ stream, on the device: every seed in one call, no mask (a
        boolean index asks the device for its count: a host sync)."""
        seeds = torch.tensor([self.lanes[li].seed for li in lane_of.tolist()], dtype=torch.long) ^ stream
        return seeds.to(self.dev)

    # ---- one round -----------------------------------------------------------------------
    def _round(self, st, tkv):
        """draft, verify, accept, commit, then the round's one read of the device. On fixed shapes
        the next round's draft is queued behind this round's commit, before the host reads the
        commit back (its inputs, the roots, root tokens, the drafter's cache and step-1 outputs,
        are all on the device by then), so the device drafts while the host updates the sequences
        and decides the retires; a retire drops it (its rows change) and the next round drafts again
        (counted: drafts_discarded). The same draft either way: the same inputs through the same
        graph, in the same order on the device. Behind that draft the next round's verify is queued
        too where its graph exists (`_verify_ahead`: the tree at the longest committed row, which
        the device finds), so the device verifies while the host reads the round back and applies
        it; a retire, an undone round or the loop's end drops it (verifies_discarded).
        An accept replayed from a graph is committed before the host has read whether every top-p
        pivot lay within the window it searched (`ok`, read back with the commit). Where one did
        not, the round is undone (`_undo`) and run again with the exact accept (counted:
        accept_pivots_deeper): the verify writes the tree's slots again from the same cache, so
        the second commit moves what the first would have moved from a right accept."""
        t, st.drafted = st.drafted, None
        if t is None:
            with self._phase("draft"):
                t = self.drafts.draft(st)
        queued, st.verified = st.verified, None
        exact = False
        while True:
            self.counts["kv_bytes"] += cache_bytes(tkv, self.fixed_width)   # what the verify's attention reads
            if queued is None:
                with self._phase("verify_forward"):
                    scored = verify_forward(self.model, tkv, t["tokens"], t["parents"], t["valid"],
                                            st.root_on(tkv.length.device) + 1,
                                            self.points, fixed=self.fixed_width, graphs=self.graphs.get("verify"))
            else:
                scored, queued = queued[0], None
            with self._phase("accept"):
                res, exp, ok = self.accepts.accept(st, t, scored, exact)
            # what the commit changes on the drafter's side, kept where the round may be undone
            before = (st.dkv.length.clone(), st.r_root) if ok is not None else None
            with self._phase("commit"):
                read_back, ahead = self._commit(st, tkv, t, res, scored, exp, ok)
            if ahead is not None:
                with self._phase("draft"):
                    st.drafted = self.drafts.draft(st, ahead.root, ahead.root_tokens)
                if ahead.length is not None:
                    st.verified = self._verify_ahead(st.drafted, tkv, ahead)
            with self._phase("commit"):
                back = read_back()
            if back.ok:
                break
            self.counts["accept_pivots_deeper"] += 1
            self._undo(st, tkv, before)
            self.accepts.widen()
            exact = True
        self._record(st, back)
        back.apply()
        if st.verified is not None:
            st.verified[1]()                       # the queued verify's host part, now the crop is known

    def _verify_ahead(self, t: dict, tkv, ahead: "Ahead"):
        """The next round's verify queued behind this round's commit and the next draft, before the
        host reads the round back (tree_forward.verify_queued: the tree at the longest committed
        row, found on the device), so the device verifies while the host records the round and
        decides the retires: (Scored, placed), or None where it cannot be (no verify graph of the
        bucket yet) or is not worth it. A retire, an undone round or the loop's end drops it
        (verifies_discarded): a verify's device time lost each time. So only where the draft queued
        ahead is too short to cover the host's read-back (S <= verify_ahead_steps). Measured (H100,
        the bench pair, one process, reports/bench/NOTES.md, twenty-fourth stop): chain-1 -3 to -6%;
        s3-k8-d16 +2 to +4%, whose 4-step draft already kept the device busy through the read-back
        and whose 8 dropped verifies of 1,536 nodes cost more than the queue saved. The profile's
        "verify_forward" phase is entered only past those checks, so a profiled round without graphs
        holds one verify (bench/sampled.verify_profile counts them)."""
        graphs = self.graphs.get("verify")
        if graphs is None or self.S > self.verify_ahead_steps:
            return None
        with self._phase("verify_forward"):
            return verify_queued(self.model, tkv, t["tokens"], t["parents"], t["valid"], ahead.root + 1, ahead.length,
                                 self.points, graphs, grow=self.S + 1)

    def _undo(self, st, tkv, before) -> None:
        """A round committed on an accept that was not the rule's (a top-p pivot past the graph's
        window) taken back before the host applied it: the drafter's lengths and step-1 outputs as
        before the commit (its pairs past them are written again), the draft queued ahead dropped,
        the target's views as before the verify (tree_forward.rewind_verify; its lengths were not
        yet assigned: the commit's crop is the host's part)."""
        length, r_root = before
        st.dkv.length.copy_(length)
        st.r_root = r_root
        self.counts["drafts_discarded"] += st.drafted is not None
        self.counts["verifies_discarded"] += st.verified is not None
        st.drafted = st.verified = None
        rewind_verify(tkv)

    def _record(self, st, back: "ReadBack"):
        """Each unfinished row's round: its root, accepted drafts and P(a >= d) over its own tree's depths."""
        roots, done, lanes = st.root.tolist(), st.done.tolist(), st.lane_of.tolist()
        for b, i in enumerate(st.active.tolist()):
            if done[b]:
                continue
            o = st.out[i]
            o.roots.append(roots[b])
            o.accepted.append(back.accepted[b])
            o.expected.append(back.expected[b][:self.trees[self.lane_tree[lanes[b]]].num_steps])

    def _commit(self, st, tkv, t, res, scored, exp, ok):
        """Root + accepted nodes into the target's cache; drafts then the bonus into seq;
        pairs j+1 .. j+1+a (hidden states of nodes path[0..a], tokens emitted[0..a]) into the
        drafter's cache. Finished rows commit nothing. The device's part is queued here; returns
        (read_back, ahead): read_back() waits for the round's one copy to the host (what the
        commit emitted and the new lengths, the accepted counts, exp [B, S] and ok) and returns
        it as a `ReadBack`, whose apply() is the host's part (the crop, seq); it is called after
        whatever the caller queues behind the commit. ahead: the next round's roots and root
        tokens on the device [B] (a finished row keeps its own), on fixed shapes only (else None)."""
        B = len(st.n)
        path, a = res.path.to(self.dev), res.accepted.to(self.dev)               # [B, S+1], [B]
        live = ~st.done_on(self.dev)
        fixed = self._dense() and all(isinstance(x, BufferLayer) for x in cache_layers(tkv.cache))
        keep = torch.where(live[:, None], path, -1)
        if fixed:
            length = self._commit_target(tkv, keep)          # cropped in apply(), from the round's one host copy
        else:
            commit(tkv, keep)
        drafts = t["tokens"].gather(-1, path[:, 1:].clamp(min=0))                 # [B, S]
        emitted = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], -1)
        emitted.scatter_(-1, a[:, None], res.bonus.to(self.dev)[:, None])         # drafts, then the bonus
        width = self.S + 1 if self._dense() else int(a.max()) + 1                 # fixed: one shape a round
        step = torch.arange(width, device=self.dev)[None].expand(B, width)
        node = path[:, :width].clamp(min=0)
        count = torch.where(live, a + 1, torch.zeros_like(a))
        root = st.root_on(self.dev)
        self.drafts.extend(st, scored.states, lambda s: at_nodes(s, node), emitted[:, :width],
                     root[:, None] + 1 + step, count, node=node)
        ahead = None
        if self._dense():                                  # the next round's draft is queued behind (`_round`)
            last = emitted.gather(-1, (count - 1).clamp(min=0)[:, None])[:, 0]    # the new root token
            ahead = Ahead(root + count, torch.where(count > 0, last, self.drafts.root_tokens(st)),
                           length if fixed else None)
        good = torch.ones((), dtype=torch.bool, device=self.dev) if ok is None else ok.to(self.dev)
        parts = [count[:, None], emitted[:, :width], a[:, None], good.long().expand(B)[:, None]]
        parts += [length[:, None].to(self.dev)] if fixed else []
        host, copied = to_host(torch.cat(parts, 1))                               # one copy to the host
        host_exp, exp_copied = to_host(exp.float())

        def apply():
            n_new, got, steps = host[:, 0], host[:, 1:width + 1], torch.arange(width)[None].expand(B, width)
            if fixed:
                crop_committed(tkv, length, int(host[:, -1].max()))
            grow = int((st.n + n_new).max()) - st.seq.shape[1]
            if grow > 0:
                st.seq = torch.cat([st.seq, torch.zeros(B, grow, dtype=torch.long)], dim=1)
            new = steps < n_new[:, None]                            # the row's emitted tokens (none when done)
            st.seq[torch.arange(B)[:, None].expand(B, width)[new], (st.n[:, None] + steps)[new]] = got[new]
            st.n = st.n + n_new
            if ahead is not None:
                st.roots_known(ahead.root)                          # root + count: the new n - 2, on the device

        def read_back() -> ReadBack:
            copied()
            exp_copied()
            return ReadBack(host[:, width + 1].tolist(), host_exp.tolist(), bool(host[:, width + 2].all()), apply)
        return read_back, ahead

    def _commit_target(self, tkv, path) -> torch.Tensor:
        """The target's cache keeps each row's root and accepted nodes on fixed shapes
        (tree_forward.commit_fixed), replayed from a graph per rows where the loop has them: the
        rows' new lengths (the caller crops)."""
        def forward(x: dict) -> dict:
            return {"length": commit_fixed(replace(tkv, length=x["length"]), x["path"], x["block"])}
        key = (tkv.block, str(tkv.length.device))            # one copy for each block size, not one a round
        if key not in self._blocks:
            self._blocks[key] = to_device(torch.tensor([tkv.block]), tkv.length.device)
        x = {"path": path, "length": tkv.length, "block": self._blocks[key]}
        return (self._by_graph("commit", self.model, stamps(tkv.cache), x, tuple(path.shape), forward)
                or forward(x))["length"]

    # ---- finishing rows ------------------------------------------------------------------
    def _retire(self, st, tkv, prompts, max_new_tokens) -> Rows:
        """Rows that emitted max_new_tokens or an end-of-sequence token are finished; they leave
        the batch once they are RETIRE_FRACTION of it (until then they ride along, committing
        nothing), so the caches are re-indexed a few times per batch, not every round; on fixed
        shapes (`_dense`: CUDA's, where rounds replay graphs, or not: the same batches either way,
        so the same sums), once they are RETIRE_FRACTION_GRAPHED of it and carry enough of the
        verify's nodes to repay the captures a retire costs (`_retiring`)."""
        plen = torch.tensor([len(prompts[st.out[i].prompt]) for i in st.active.tolist()])
        idx = torch.arange(st.seq.shape[1])[None]
        cont = (idx >= plen[:, None]) & (idx < st.n[:, None]) & (idx < (plen + max_new_tokens)[:, None])
        eos = (torch.isin(st.seq, torch.tensor(self.eos, dtype=torch.long)) & cont).any(-1) if self.eos \
            else torch.zeros(len(plen), dtype=torch.bool)
        done = eos | (st.n >= plen + max_new_tokens)
        for b in torch.nonzero(done & ~st.done)[:, 0].tolist():
            st.finish(b, int(plen[b]), max_new_tokens, self.eos)
        st.done = done
        if not (done.all() or retiring(done, self._dense(), self.D)):
            return st
        self.counts["drafts_discarded"] += st.drafted is not None           # drafted ahead for rows that change
        self.counts["verifies_discarded"] += st.verified is not None
        if done.all():
            return Rows(st.seq[:0], st.n[:0], None, None, st.lane_of[:0], st.active[:0], st.out, st.coin_row[:0],
                         done[:0])
        keep = torch.nonzero(~done)[:, 0]
        select_rows(tkv, keep)
        return st.keep(keep, self.dev)
