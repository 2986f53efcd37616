"""The speculative decode loop (diag.replay.decode_loop) on the zoo's trained tiny pair: at
T -> 0 it reproduces the teacher-forced greedy replay round for round (chains, a top-4 tree,
EAGLE mode); under sampling it is deterministic per seed whatever the batching, and its
Monte-Carlo accept length agrees with the exact per-round expectation within its interval."""

from dataclasses import replace

import pytest
import torch

from diag.run.shipped import DEMO, shipped
from diag.drafter.checkpoint import load_drafter
from diag.engines.decoding import GREEDY, sampled
from diag.replay.decode_loop import DecodeLoop
from diag.replay.decode_rows import Lane
from diag.replay.evaluation import trajectory_rounds
from diag.replay.replay import Variant, replay
from diag.replay.sampled_summary import summarize_sampled
from diag.run.case import read_case
from diag.run.inputs import prepare
from diag.run.target_passes import special_ids
from diag.target.load import load_embed_and_head, load_target
from diag.target.passes import build_sequences, run_capture
from diag.trees import tree_shape

PROMPTS, NEW = 8, 24
SHAPES = [tree_shape(t) for t in ("chain-3", "s3-k4-d8", "chain-1")]
WINDOW = max(s.num_steps for s in SHAPES)


@pytest.fixture(scope="module")
def zoo():
    case = read_case(shipped(DEMO))
    case = replace(case, prompts=replace(case.prompts, limit=PROMPTS, max_new_tokens=NEW))
    inp = prepare(case)
    model, _ = load_target(inp.target_path, dtype=torch.float32)
    drafter, _ = load_drafter(inp.drafter_path, dtype=torch.float32)
    embed, head = load_embed_and_head(inp.target_path)
    eos, pad = special_ids(inp.tokenizer)
    seqs = build_sequences(model, inp.prompts, NEW, pad_id=pad, eos_ids=eos, progress=False)
    tp = run_capture(model, seqs, inp.points, regime="as-loaded", token_budget=16384, progress=False)
    layouts = {c.label: c.layout for c in inp.candidates}
    return dict(inp=inp, model=model, drafter=drafter, embed=embed, head=head, eos=eos, seqs=seqs, tp=tp,
                layouts=layouts, prompts=[p for _, _, p in inp.prompts])


def decode(z, variants, shape, decoding, seeds=(0,), batches=1):
    lanes = [Lane(v, s) for v in variants for s in seeds]
    loop = DecodeLoop(z["model"], z["drafter"], z["embed"], z["head"], lanes, z["layouts"], shape, decoding,
                      eos_ids=z["eos"])
    rows = [(li, p) for li in range(len(lanes)) for p in range(len(z["prompts"]))]
    step = -(-len(rows) // batches)
    out = []
    for i in range(0, len(rows), step):
        out += loop.run(z["prompts"], rows[i:i + step], NEW)
    return out


@pytest.mark.parametrize("decoding", [GREEDY, sampled(1e-7)], ids=["greedy", "t-to-0"])
def test_t_to_zero_reproduces_the_teacher_forced_replay_round_for_round(zoo, decoding):
    """Same continuations, same rounds, same accepted counts as replay.py's greedy trajectory,
    for every candidate (EAGLE mode included) on a chain, a top-4 tree and a depth-1 chain."""
    variants = [Variant(c.label, c.mode, s) for c in zoo["inp"].candidates for s in SHAPES]
    want = {r.variant: trajectory_rounds(r.accepted, r.roots)
            for r in replay(zoo["drafter"], zoo["embed"], zoo["head"], {"as-loaded": zoo["tp"]}, variants,
                            zoo["layouts"], progress=False)}
    for shape in SHAPES:
        mine = [v for v in variants if v.tree == shape]
        out = decode(zoo, mine, shape, decoding)
        for v in mine:
            rows = sorted((o for o in out if o.lane.variant == v), key=lambda o: o.prompt)
            got_a, got_j = [], []
            for o in rows:
                assert o.ids == zoo["seqs"][o.prompt].ids.tolist(), "the decode emitted another continuation"
                keep = o.rounds_in_window(len(zoo["prompts"][o.prompt]), WINDOW)
                got_a.append([o.accepted[i] for i in keep])
                got_j.append([o.roots[i] for i in keep])
                assert all(abs(sum(o.expected[i]) - o.accepted[i]) < 1e-6 for i in keep)   # deterministic
            assert (got_a, got_j) == want[v], v.key
            assert sum(map(len, got_a)) > 0


@pytest.mark.parametrize("decoding", [sampled(1e-7), sampled(1.0, 0.95)], ids=["t-to-0", "t1-p0.95"])
def test_one_loop_over_several_trees_decodes_what_each_trees_own_loop_decodes(zoo, decoding):
    """Lanes of chain-3, s3-k4-d8 and chain-1 in one loop (one verify a round, the trees padded to
    8 nodes) decode, row for row, what one loop per tree decodes: the same ids, rounds, accepted
    counts and P(a >= d) of each row's own depths; the forward verified 8 nodes a row a round."""
    variants = [Variant(c.label, c.mode, s, decoding=decoding.name) for c in zoo["inp"].candidates[:2] for s in SHAPES]
    lanes = [Lane(v, 0) for v in variants]
    loop = DecodeLoop(zoo["model"], zoo["drafter"], zoo["embed"], zoo["head"], lanes, zoo["layouts"], None,
                      decoding, eos_ids=zoo["eos"])
    rows = [(li, p) for li in range(len(lanes)) for p in range(len(zoo["prompts"]))]
    mixed = loop.run(zoo["prompts"], rows, NEW)
    assert loop.D == 8 and loop.S == 3 and loop.counts["verified_tokens"] % 8 == 0
    got = {(o.lane.variant, o.prompt): o for o in mixed}
    for shape in SHAPES:
        mine = [v for v in variants if v.tree == shape]
        for o in decode(zoo, mine, shape, decoding):
            m = got[(o.lane.variant, o.prompt)]
            assert (m.ids, m.roots, m.accepted, m.length) == (o.ids, o.roots, o.accepted, o.length), shape.name
            assert all(len(e) == shape.num_steps for e in m.expected)
            torch.testing.assert_close(torch.tensor(m.expected), torch.tensor(o.expected), rtol=0, atol=1e-6)


def test_a_loop_refuses_a_shape_its_lanes_do_not_carry(zoo):
    c = zoo["inp"].candidates[0]
    lanes = [Lane(Variant(c.label, c.mode, SHAPES[0]), 0)]
    with pytest.raises(ValueError, match="carry trees"):
        DecodeLoop(zoo["model"], zoo["drafter"], zoo["embed"], zoo["head"], lanes, zoo["layouts"], SHAPES[1],
                   GREEDY, eos_ids=zoo["eos"])


def test_sampled_decode_is_deterministic_per_seed_whatever_the_batching(zoo):
    c = zoo["inp"].candidates[0]
    shape = tree_shape("s2-k2-d4")
    v = [Variant(c.label, c.mode, shape)]
    d = sampled(1.0, 0.95)
    one = decode(zoo, v, shape, d, seeds=(0, 1))
    two = decode(zoo, v, shape, d, seeds=(0, 1), batches=3)
    key = lambda o: (o.lane.seed, o.prompt)                                      # noqa: E731
    assert [(o.accepted, o.ids) for o in sorted(one, key=key)] == [(o.accepted, o.ids) for o in sorted(two, key=key)]
    s0 = [o.ids for o in sorted(one, key=key) if o.lane.seed == 0]
    s1 = [o.ids for o in sorted(one, key=key) if o.lane.seed == 1]
    assert s0 != s1                                                              # seeds differ
    assert s0 != [s.ids.tolist() for s in zoo["seqs"]]                           # T = 1 is not greedy


def test_monte_carlo_agrees_with_the_exact_expectation_within_its_interval(zoo):
    c = next(c for c in zoo["inp"].candidates if c.mode == "eagle3")
    shape = tree_shape("chain-3")
    v = Variant(c.label, c.mode, shape, decoding=sampled(1.0).name)
    out = decode(zoo, [v], shape, sampled(1.0), seeds=(0, 1, 2, 3))
    e = summarize_sampled(v, out, [f"p{i}" for i in range(PROMPTS)], [len(p) for p in zoo["prompts"]],
                          window_steps=WINDOW, buckets=(0, 4096), seed=0, n_boot=500)
    lo, hi = e.accept_length_ci95
    assert lo <= e.expected_accept_length <= hi
    assert abs(e.accept_length - e.expected_accept_length) < 0.1
    assert e.seeds == (0, 1, 2, 3) and e.trajectory.rounds == sum(p.rounds for p in e.per_prompt)
    depth_mc = e.trajectory.accepted_hist
    assert sum(depth_mc) == e.trajectory.rounds
    # E[a + 1] = 1 + sum_d P(a >= d): the exact expectation is the sum of its depths' (1 + 0.219 + 0.045
    # + 0.012 = 1.276 on the demo pair at T 1.0, whose drafter was trained on greedy continuations)
    assert e.expected_accept_length == pytest.approx(1 + sum(e.expected_acceptance_at_depth), rel=1e-9)
    assert 1.2 < e.expected_accept_length < 1.35
    assert len(e.expected_acceptance_at_depth) == 3
    assert list(e.expected_acceptance_at_depth) == sorted(e.expected_acceptance_at_depth, reverse=True)


def test_t_to_zero_under_to_end_accounting_counts_the_rounds_replay_scores_past_the_end(zoo):
    """vLLM's accounting ("to-end"): every round until the request ends, the one max_tokens cuts
    included. The loop's counted rounds at T -> 0 equal replay's on sequences with the target's
    lookahead past the end, and some request's last round crosses max_new_tokens."""
    from diag.replay.round_accounting import ACCOUNTINGS
    to_end, shape = ACCOUNTINGS["to-end"], tree_shape("chain-3")
    _, pad = special_ids(zoo["inp"].tokenizer)
    seqs = build_sequences(zoo["model"], zoo["inp"].prompts, NEW, pad_id=pad, eos_ids=zoo["eos"], progress=False,
                           lookahead=shape.num_steps)
    tp = run_capture(zoo["model"], seqs, zoo["inp"].points, regime="as-loaded", token_budget=16384, progress=False)
    c = next(c for c in zoo["inp"].candidates if c.mode == "eagle3")
    v = Variant(c.label, c.mode, shape)
    res = replay(zoo["drafter"], zoo["embed"], zoo["head"], {"as-loaded": tp}, [v], zoo["layouts"], progress=False,
                 accounting=to_end)[0]
    want = trajectory_rounds(res.accepted, res.roots)
    got_a, got_j, cut = [], [], 0
    for o in sorted(decode(zoo, [v], shape, sampled(1e-7)), key=lambda o: o.prompt):
        keep = o.rounds_counted(len(zoo["prompts"][o.prompt]), shape.num_steps, to_end)
        got_a.append([o.accepted[i] for i in keep])
        got_j.append([o.roots[i] for i in keep])
        last = keep[-1]
        cut += o.roots[last] + 2 + o.accepted[last] > o.length - 1      # emitted past t_{T-1}: cut
    assert (got_a, got_j) == want
    assert cut > 0, "no request's last round crossed max_new_tokens: the test shows nothing"


def _dense_verify(monkeypatch):
    """The loop as it was before issue 36's cuts: the head over every tree node, then read."""
    import diag.replay.decode_loop as dl
    from diag.target import tree_forward as tf

    def dense(*args, **kwargs):
        s = tf.verify_forward(*args, **kwargs)
        return tf.Scored(s.logits.rows(torch.arange(s.logits.shape[0] * s.logits.shape[1])).view(s.logits.shape),
                         s.states)
    monkeypatch.setattr(dl, "verify_forward", dense)


@pytest.mark.parametrize("tree", ["chain-3", "s3-k4-d8"])
def test_head_at_read_nodes_and_one_thread_decode_what_the_dense_head_and_two_threads_did(zoo, monkeypatch, tree):
    """Issue 36's CPU cuts change no number: the verify's head run only at the nodes the accept
    step reads, with one intra-op thread, gives the rows (drafts accepted, ids, P(a >= d)) the head
    over every node gave with the caller's 2 threads, for demo-sampled's lanes (every candidate,
    2 seeds) at its decoding; so its accept lengths are today's, within any Monte-Carlo interval."""
    from diag.replay import decode_loop as dl, decode_rows
    shape = tree_shape(tree)
    variants = [Variant(c.label, c.mode, shape) for c in zoo["inp"].candidates]
    d = sampled(1.0, 0.95)
    seen = []
    real = dl.verify_forward
    monkeypatch.setattr(dl, "verify_forward", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        new = decode(zoo, variants, shape, d, seeds=(0, 1))
        assert set(seen) == {decode_rows.CPU_THREADS} and torch.get_num_threads() == 2      # one thread inside, restored
        monkeypatch.setattr(decode_rows, "CPU_THREADS", 2)
        _dense_verify(monkeypatch)
        old = decode(zoo, variants, shape, d, seeds=(0, 1))
    finally:
        torch.set_num_threads(before)
    key = lambda o: (o.lane.variant.key, o.lane.seed, o.prompt)                    # noqa: E731
    rows = lambda out: [(o.accepted, o.ids, o.expected) for o in sorted(out, key=key)]   # noqa: E731
    assert rows(new) == rows(old)
    assert sum(sum(o.accepted) for o in new) > 0


def test_node_logits_are_the_head_at_those_nodes(zoo):
    from diag.target.tree_forward import NodeLogits
    model = zoo["model"]
    final = torch.randn(3, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    lg = NodeLogits(model, final)
    assert lg.shape == (3, 5, model.config.vocab_size)
    at = torch.tensor([0, 7, 14])
    want = model.get_output_embeddings()(final).float().reshape(15, -1)[at]
    assert torch.allclose(lg.rows(at), want, atol=1e-5) and lg.rows(at).dtype == torch.float32


def _decode_fixed(z, variants, shape, decoding, fixed, monkeypatch, widths):
    """decode() with the loop's verify on fixed widths or not, recording the key width each
    verify's attention saw (BufferLayer.update's return)."""
    from diag.target.kv_buffer import BufferLayer
    real = BufferLayer.update

    def update(self, *a, **k):
        out = real(self, *a, **k)
        widths.append(out[0].shape[-2])
        return out
    monkeypatch.setattr(BufferLayer, "update", update)
    lanes = [Lane(v, 0) for v in variants]
    loop = DecodeLoop(z["model"], z["drafter"], z["embed"], z["head"], lanes, z["layouts"], shape, decoding,
                      eos_ids=z["eos"])
    loop.fixed_width = fixed
    rows = [(li, p) for li in range(len(lanes)) for p in range(len(z["prompts"]))]
    out = loop.run(z["prompts"], rows, NEW)
    monkeypatch.setattr(BufferLayer, "update", real)
    return out


@pytest.mark.parametrize("tree", ["chain-3", "s3-k4-d8"])
@pytest.mark.parametrize("decoding", [GREEDY, sampled(1.0, 0.95)], ids=["greedy", "t1"])
def test_a_verify_on_fixed_widths_decodes_what_the_growing_cache_did(zoo, monkeypatch, tree, decoding):
    """Issue 36: on CUDA the verify's attention reads the cache's whole buffer, the slots past the
    tree masked, so every round of a batch has one shape (cuDNN plans once, not every round; the
    H100's loop paid ~60 ms a round for it). Forced on the CPU, it decodes the same: same drafts
    accepted, same ids, P(a >= d) equal to the sums' rounding; and the width it attends over is the
    buffer's, constant, where the growing cache's grows every round."""
    shape = tree_shape(tree)
    variants = [Variant(c.label, c.mode, shape) for c in zoo["inp"].candidates[:2]]
    seen_fixed, seen_grown = [], []
    new = _decode_fixed(zoo, variants, shape, decoding, True, monkeypatch, seen_fixed)
    old = _decode_fixed(zoo, variants, shape, decoding, False, monkeypatch, seen_grown)
    key = lambda o: (o.lane.variant.key, o.prompt)                                 # noqa: E731
    new, old = sorted(new, key=key), sorted(old, key=key)
    assert [(o.accepted, o.ids) for o in new] == [(o.accepted, o.ids) for o in old]
    gap = max((torch.tensor(a.expected) - torch.tensor(b.expected)).abs().max().item() for a, b in zip(new, old))
    assert gap < 1e-4, gap
    prefill = len(seen_fixed) - len(seen_grown)
    assert prefill == 0
    layers = zoo["model"].config.num_hidden_layers
    verify_fixed = seen_fixed[layers:]                                # after the prefill's update
    verify_grown = seen_grown[layers:]
    assert len(set(verify_fixed)) <= 2, "the attention's width changed round after round"   # one batch; a retire keeps it
    assert len(set(verify_grown)) > 5 and max(verify_fixed) >= max(verify_grown)


def test_the_fixed_bias_from_tensors_is_the_bias_from_the_hosts_block():
    """tree_forward.fixed_bias (inside the verify's graph: the block a [1] tensor) gives exactly
    attention_bias over the committed slots up to the block, the tree, then the tail hidden.
    Worked example: length 3, block 4, tree parents [-1, 0, 0] at slots 4..6 of 9: node 2 sees
    slots 0..2, 4 and 6."""
    from diag.target.tree_forward import attention_bias, fixed_bias, tree_sees

    parents = torch.tensor([[-1, 0, 0], [-1, 0, 1], [-1, 0, -1]])
    valid = torch.tensor([[True, True, True], [True, True, True], [True, True, False]])
    length, block, width = torch.tensor([3, 4, 0]), 4, 9
    sees = tree_sees(parents, valid)
    got = fixed_bias(length, torch.tensor([block]), sees, width, torch.bfloat16)
    past = torch.arange(block)[None] < length[:, None]
    want = attention_bias(past, sees, torch.bfloat16, past.new_zeros(3, width - block - 3))
    assert got.shape == want.shape == (3, 1, 3, 9) and torch.equal(got, want)
    seen = (got[0, 0, 2] == 0).nonzero()[:, 0].tolist()
    assert seen == [0, 1, 2, 4, 6]
    assert (got[2, 0, 2] == 0).nonzero()[:, 0].tolist() == [6]          # an invalid node sees itself only


def test_rows_kept_from_a_buffer_are_zero_past_their_length():
    """A whole-buffer attention reads the slots past each row's length with weight 0: they must
    hold numbers (uninitialised memory may hold NaN, and 0 x NaN is NaN)."""
    from transformers.cache_utils import DynamicLayer

    from diag.target.kv_buffer import BufferLayer, fixed_width
    layer = DynamicLayer()
    k, v = torch.full((3, 2, 4, 8), float("nan")), torch.ones(3, 2, 4, 6)
    layer.lazy_initialization(k, v) if hasattr(layer, "lazy_initialization") else None
    layer.keys, layer.values, layer.is_initialized = k.clone(), v.clone(), True
    buf = BufferLayer.of(layer, 10)
    buf.keys[:] = 1.0
    buf.take_rows(torch.tensor([2, 0]), 3)
    assert buf.buf_k.shape == (2, 2, 10, 8) and torch.equal(buf.buf_k[:, :, 3:], torch.zeros(2, 2, 7, 8))
    assert torch.equal(buf.buf_v[:, :, 3:], torch.zeros(2, 2, 7, 6))

    class Cache:
        layers = [buf]
    with fixed_width(Cache, 25) as width:                 # reserves room first: doubled past 25
        assert width == 50 and buf.whole
        keys, _ = buf.update(torch.ones(2, 2, 1, 8), torch.ones(2, 2, 1, 6))
        assert keys.shape[-2] == 50 and buf.keys.shape[-2] == 4
    assert not buf.whole


def test_a_verify_given_graphs_it_cannot_use_runs_eagerly_and_counts_it(zoo):
    """verify_forward(graphs=...) on the CPU: no graph is usable, the forward runs eagerly on the
    fixed widths (counted as such), and scores what the same verify without graphs scores."""
    from diag.target.tree_forward import prefill, verify_forward
    from diag.target.verify_graphs import VerifyGraphs
    model = zoo["model"]
    ids = torch.tensor([zoo["prompts"][0][:6], zoo["prompts"][1][:6]])
    points = (zoo["inp"].points[0],)
    tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    parents = torch.tensor([[-1, 0, 1, 2]] * 2)
    valid = torch.ones(2, 4, dtype=torch.bool)
    got = []
    for graphs in (VerifyGraphs(), None):
        kv, _ = prefill(model, ids, torch.ones_like(ids, dtype=torch.bool), points, capacity=16)
        s = verify_forward(model, kv, tokens, parents, valid, torch.tensor([5, 5]), points, fixed=True, graphs=graphs)
        got.append((s.states["final"], graphs))
    (a, graphs), (b, _) = got
    assert graphs.counts == {"captured": 0, "replayed": 0, "eager": 1, "capture_s": 0.0, "warm_s": 0.0, "record_s": 0.0}
    assert graphs.failure is None
    assert torch.equal(a, b)


def test_a_verify_queued_behind_a_commit_scores_what_the_verify_after_the_read_back_scores(zoo, monkeypatch):
    """tree_forward.verify_queued (the decode loop's next verify, queued before the host knows the
    committed lengths) on the CPU's graph stand-in: None before its bucket's graph exists and where
    the tree might not fit the buffer; else the tree at the longest committed row (found from the
    lengths tensor), and placed() leaves the block and the views as verify_forward does. Worked
    example: prompts of 6, a chain of 4 at slots 6..9, paths of 2 and 3 nodes -> lengths [8, 9];
    the next tree at slots 9..12, block 9, views 13."""
    from graph_standin import stand_in
    from diag.target.tree_forward import cache_layers, commit_fixed, crop_committed, prefill, verify_forward, \
        verify_queued
    from diag.target.verify_graphs import VerifyGraphs
    model, points = zoo["model"], (zoo["inp"].points[0],)
    ids = torch.tensor([zoo["prompts"][0][:6], zoo["prompts"][1][:6]])
    parents, valid = torch.tensor([[-1, 0, 1, 2]] * 2), torch.ones(2, 4, dtype=torch.bool)
    first, second = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]), torch.tensor([[13, 14, 15, 16], [17, 18, 19, 20]])
    path = torch.tensor([[0, 1, -1, -1], [0, 1, 2, -1]])
    held = []
    stand_in(monkeypatch, lambda: cache_layers(held[-1].cache) if held else [])
    states = []
    for queue in (True, False):
        kv, _ = prefill(model, ids, torch.ones_like(ids, dtype=torch.bool), points, capacity=16)
        held.append(kv)
        graphs = VerifyGraphs() if queue else None
        if queue:
            assert verify_queued(model, kv, first, parents, valid, kv.length, kv.length, points, graphs, grow=4) is None
        verify_forward(model, kv, first, parents, valid, kv.length, points, fixed=True, graphs=graphs)
        length = commit_fixed(kv, path, torch.tensor([kv.block]))
        assert length.tolist() == [8, 9]
        if queue:
            assert verify_queued(model, kv, second, parents, valid, length, length, points, graphs, grow=8) is None
            scored, placed = verify_queued(model, kv, second, parents, valid, length, length, points, graphs, grow=4)
            crop_committed(kv, length, int(length.max()))
            placed()
        else:
            crop_committed(kv, length, int(length.max()))
            scored = verify_forward(model, kv, second, parents, valid, length, points, fixed=True)
        assert kv.block == 9 and all(x.keys.shape[-2] == 13 for x in cache_layers(kv.cache))
        states.append(scored.states[points[0].name])
    assert torch.equal(*states)


def test_the_loop_reads_the_verify_graphs_switch(zoo, monkeypatch):
    shape = tree_shape("chain-1")
    lanes = [Lane(Variant(c.label, c.mode, shape), 0) for c in zoo["inp"].candidates[:1]]
    for value, want in (("0", False), ("1", True)):
        monkeypatch.setenv("DIAG_VERIFY_GRAPHS", value)
        loop = DecodeLoop(zoo["model"], zoo["drafter"], zoo["embed"], zoo["head"], lanes, zoo["layouts"], shape,
                          GREEDY, eos_ids=zoo["eos"])
        assert loop.cuda_graphs is want


@pytest.mark.parametrize("trees", [("chain-3",), ("s3-k4-d8",), ("chain-3", "s3-k4-d8")])
def test_the_loops_graph_bookkeeping_replays_what_the_eager_round_computes(zoo, monkeypatch, trees):
    """VerifyGraphs.run and the loop's replay paths on the CPU, with a stand-in for the CUDA
    graph that re-runs the captured forward on the graph's own inputs and copies into its own
    outputs (as a replay writes them): the inputs copied in every round, the views cropped after a
    replay, the graphs dropped when rows retire (new buffers), the outputs handed out as copies.
    Every step of a round (draft, verify, accept, commit, the drafter's extend) replayed every round, and
    the loop decodes exactly what the eager round on fixed shapes decodes; so does a loop whose
    accept graph reports every round's top-p pivot past its window (each round, committed before
    the host read that, then undone and run again with the exact accept, and counted). Lanes of two trees in one loop: the draft and the
    accept per tree (a graph each), the verify, commit and extend once over both."""
    import diag.replay.accept as accept
    import diag.replay.decode_loop as dl
    import diag.target.tree_forward as tf
    from graph_standin import stand_in
    caches, real_fixed = [], tf.fixed_width
    monkeypatch.setattr(tf, "fixed_width", lambda cache, *a: caches.append(cache) or real_fixed(cache, *a))
    stand_in(monkeypatch, lambda: caches[-1].layers if caches else [])
    monkeypatch.setattr(DecodeLoop, "_graphs_possible", lambda self: True)
    shapes = [tree_shape(t) for t in trees]
    lanes = [Lane(Variant(c.label, c.mode, shape), s) for c in zoo["inp"].candidates[:2] for s in (0, 1)
             for shape in shapes]
    out = {}
    for name, graphs in (("graphs", True), ("eager", False), ("deeper", True)):
        if name == "deeper":
            real = accept.target_kept
            monkeypatch.setattr(accept, "target_kept", lambda *a, **k: (real(*a, **k)[0], torch.tensor(False)))
        loop = DecodeLoop(zoo["model"], zoo["drafter"], zoo["embed"], zoo["head"], lanes, zoo["layouts"],
                          shapes[0] if len(shapes) == 1 else None, sampled(1.0, 0.95), eos_ids=zoo["eos"])
        loop.cuda_graphs, loop.fixed_width = graphs, True
        assert loop.verify_ahead_steps == 1 < loop.S                # by default queued for chain-1 only
        loop.verify_ahead_steps = loop.S                            # here for these trees too
        rows = [(li, p) for li in range(len(lanes)) for p in range(len(zoo["prompts"]))]
        out[name] = ([(d.accepted, d.ids, d.expected) for d in loop.run(zoo["prompts"], rows, NEW)],
                     dict(loop.counts))
        assert loop.graph_failures == {}
    (g, gc), (e, ec), (d, dc) = out["graphs"], out["eager"], out["deeper"]
    assert g == e == d
    assert not any(k.endswith("_graphs_replayed") for k in ec)
    for step in dl.GRAPHED:     # one mode: per tree or once a round, captured per rows, replayed every other call
        calls = gc[f"{step}_graphs_replayed"] + gc[f"{step}_graphs_captured"]
        per_tree = step in ("draft", "accept") and len(trees) > 1    # a tree whose rows all left has no call
        # a draft and its verify are queued ahead behind every commit: each retire, and the last round,
        # drops them
        rounds = gc["rounds"] + {"draft": gc["drafts_discarded"], "verify": gc["verifies_discarded"]}.get(step, 0)
        assert gc["rounds"] < calls <= rounds * len(trees) if per_tree else calls == rounds
        assert 2 <= gc[f"{step}_graphs_captured"] < gc[f"{step}_graphs_replayed"]
    assert 2 <= gc["drafts_discarded"] == gc["verify_graphs_captured"]    # the retires (new rows) and the end
    assert gc["verifies_discarded"] == gc["drafts_discarded"]
    assert gc["verify_graphs_captured"] >= 2                                                  # rows retired
    assert "accept_pivots_deeper" not in gc
    # every round committed on its graph's accept, read back, undone and run again exactly: the verify,
    # the commit and the extend twice a round, each accept call again without its graph (+ the
    # captures' warm-ups), the draft queued ahead of every first try dropped
    assert dc["accept_pivots_deeper"] == dc["rounds"] == gc["rounds"]
    for step in ("verify", "commit", "extend"):      # and the verify queued ahead of every first try dropped
        extra = dc["verifies_discarded"] if step == "verify" else 0
        assert dc[f"{step}_graphs_replayed"] + dc[f"{step}_graphs_captured"] == 2 * dc["rounds"] + extra
    calls = dc["accept_graphs_replayed"] + dc["accept_graphs_captured"]
    assert dc["accept_graphs_eager"] == calls + dc["accept_graphs_captured"]
    assert dc["drafts_discarded"] == dc["rounds"] + gc["drafts_discarded"]
    assert dc["verifies_discarded"] == dc["rounds"] + gc["verifies_discarded"]


def test_undone_rounds_widen_the_accept_graphs_rows_sorted_whole_until_no_round_is_undone(zoo, monkeypatch):
    """A target whose top-p pivots lie past the window on more rows than the accept graph sorts
    whole (here: on every row, so only a graph that sorts them all finds every pivot) runs each
    such round twice (`_round`: undone, then the exact accept). `AcceptSide.widen` multiplies the
    graph's share by DEEPER_WIDEN once rounds are undone often (WIDEN_MIN_UNDONE, WIDEN_UNDONE_SHARE) and drops the old
    accept graphs: 1/16 -> 1/4 (after round 2) -> 1 (after round 3), then no round undone; the
    same decode as the eager loop."""
    import diag.replay.accept as accept
    import diag.target.tree_forward as tf
    from diag.replay.decode_accept import DEEPER_WIDEN
    from diag.replay.sampling import DEEPER_ROWS
    from graph_standin import stand_in
    caches, real_fixed = [], tf.fixed_width
    monkeypatch.setattr(tf, "fixed_width", lambda cache, *a: caches.append(cache) or real_fixed(cache, *a))
    stand_in(monkeypatch, lambda: caches[-1].layers if caches else [])
    monkeypatch.setattr(DecodeLoop, "_graphs_possible", lambda self: True)
    real, shares = accept.target_kept, []

    def flat_everywhere(*a, deeper=DEEPER_ROWS, **k):
        shares.append(deeper)
        return real(*a, deeper=deeper, **k)[0], torch.tensor(deeper >= 1.0)
    monkeypatch.setattr(accept, "target_kept", flat_everywhere)
    shape = tree_shape("chain-3")
    lanes = [Lane(Variant(c.label, c.mode, shape), 0) for c in zoo["inp"].candidates[:2]]
    rows = [(li, p) for li in range(len(lanes)) for p in range(len(zoo["prompts"]))]
    out = {}
    for graphs in (True, False):
        loop = DecodeLoop(zoo["model"], zoo["drafter"], zoo["embed"], zoo["head"], lanes, zoo["layouts"], shape,
                          sampled(1.0, 0.95), eos_ids=zoo["eos"])
        loop.cuda_graphs, loop.fixed_width = graphs, True
        out[graphs] = ([(d.accepted, d.ids, d.expected) for d in loop.run(zoo["prompts"], rows, NEW)], loop)
    (g, gl), (e, _) = out[True], out[False]
    assert g == e
    assert DEEPER_ROWS * DEEPER_WIDEN ** 2 >= 1.0 > DEEPER_ROWS * DEEPER_WIDEN
    # rounds 1, 2, 3 undone (WIDEN_MIN_UNDONE: the first widening after the second), then none
    assert gl.counts["accept_pivots_deeper"] == 3 and gl.counts["accept_deeper_widened"] == 2 and gl.accepts.deeper == 1.0
    assert gl.counts["rounds"] > 2                         # rounds after the widening were not undone
    assert gl.counts["accept_graphs_captured"] >= 3        # one per share (1/16, 1/4, 1), each after a drop
    assert sorted(set(shares)) == [DEEPER_ROWS, DEEPER_ROWS * DEEPER_WIDEN, 1.0]


def test_a_draft_graph_needs_its_tables_resident_on_the_drafters_device():
    """decode_rows.resident_on: an embedding or head held as a parameter on the drafter's device
    may be read by a draft's graph; a lazy table (no parameter: rows read on the host) or one on
    another device may not (a copy between devices inside a capture would not be recorded)."""
    from diag.replay.decode_rows import resident_on

    cpu = torch.device("cpu")
    assert resident_on(torch.nn.Embedding(4, 2), cpu)
    assert not resident_on(torch.nn.Embedding(4, 2, device="meta"), cpu)
    assert not resident_on(torch.nn.Module(), cpu) and not resident_on(lambda x: x, cpu)


def test_the_commit_on_fixed_shapes_moves_what_the_commit_moves():
    """tree_forward.commit_fixed (a CUDA graph's commit: every path slot written, one past a row's
    accepted depth taking its own slot's value) leaves every row's committed slots, its length and
    the views as `commit` leaves them: rows behind the longest, a row that accepts nothing, a
    finished row (its path all -1), and slots moved onto slots that are other nodes' sources."""
    from transformers.cache_utils import DynamicLayer

    from diag.target.kv_buffer import BufferLayer
    from diag.target.tree_forward import TargetKV, commit, commit_fixed, crop_committed

    g = torch.Generator().manual_seed(4)
    length = torch.tensor([5, 7, 3, 7])
    block, D = 7, 6                                       # the trees at slots 7..12
    path = torch.tensor([[0, 2, 5, -1], [0, 1, 3, 4], [0, -1, -1, -1], [-1, -1, -1, -1]])

    def cache():
        layers = []
        for _ in range(2):
            x = DynamicLayer()
            x.keys, x.values, x.is_initialized = (torch.randn(4, 2, block + D, 3, generator=g),
                                                  torch.randn(4, 2, block + D, 5, generator=g), True)
            layers.append(BufferLayer.of(x, 20))

        class Cache:
            pass
        c = Cache()
        c.layers = layers
        return c
    a = cache()
    b = cache()
    for x, y in zip(a.layers, b.layers):
        y.buf_k.copy_(x.buf_k), y.buf_v.copy_(x.buf_v)
    want, got = TargetKV(a, length.clone(), block), TargetKV(b, length.clone(), block)
    commit(want, path)
    crop_committed(got, commit_fixed(got, path, torch.tensor([block])), int(want.length.max()))
    assert want.length.tolist() == [8, 11, 4, 7] and torch.equal(got.length, want.length)
    for x, y in zip(want.cache.layers, got.cache.layers):
        assert x.keys.shape == y.keys.shape == (4, 2, 11, 3)
        for r, n in enumerate(want.length.tolist()):
            assert torch.equal(x.buf_k[r, :, :n], y.buf_k[r, :, :n]) and torch.equal(x.buf_v[r, :, :n], y.buf_v[r, :, :n])


@pytest.mark.parametrize("dense, D, done, leaves", [
    (True, 2, 57, True),      # chain-1 at 96 rows: 57 finished rows take 114 nodes out of every verify
    (True, 2, 24, False),     # of 39 later, 24 finished (48 nodes): they ride along
    (True, 16, 4, False),     # s3-k8-d16, 4 of 96: under half the batch
    (True, 16, 48, True),
    (True, 16, 5, True),      # ... 5 of 9: half the batch, 80 nodes
    (False, 2, 10, True),     # growing widths (the CPU's): a tenth of the batch, whatever its nodes
    (False, 2, 9, False)])
def test_finished_rows_leave_the_batch_when_they_repay_the_captures(dense, D, done, leaves):
    """decode_rows.retiring: on fixed shapes finished rows leave once they are half the batch and
    carry RETIRE_MIN_TOKENS_GRAPHED (64) of the verify's nodes; on growing widths once they are a
    tenth of it. Batches of 96 rows (9 in the fifth case)."""
    from diag.replay.decode_rows import retiring

    B = 9 if done == 5 else 96
    mask = torch.arange(B) < done
    assert retiring(mask, dense, D) is leaves


def test_a_profiled_round_on_fixed_widths_without_graphs_holds_one_verify_phase(zoo):
    """On fixed widths the next draft is queued behind the commit; the next verify is queued too
    only where a verify graph exists (`_verify_ahead`). Without graphs the profile's
    "diag.verify_forward" ranges are one a round (bench/sampled.verify_profile counts rounds by
    them: the H100 counted 6 for 3 rounds while an empty range was opened for the verify not queued)."""
    from torch.profiler import ProfilerActivity, profile

    shape = tree_shape("chain-3")
    lanes = [Lane(Variant(c.label, c.mode, shape), 0) for c in zoo["inp"].candidates[:1]]
    rows = [(0, p) for p in range(len(zoo["prompts"]))]
    loop = DecodeLoop(zoo["model"], zoo["drafter"], zoo["embed"], zoo["head"], lanes, zoo["layouts"], shape,
                      GREEDY, eos_ids=zoo["eos"], profile=True)
    loop.cuda_graphs, loop.fixed_width = False, True
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop.run(zoo["prompts"], rows, NEW)
    verifies = [e for e in prof.events() if e.name == "diag.verify_forward"]
    drafts = [e for e in prof.events() if e.name == "diag.draft"]
    assert loop.counts["rounds"] > 2 and len(verifies) == loop.counts["rounds"]
    assert len(drafts) >= loop.counts["rounds"]                    # the draft queued behind each commit
