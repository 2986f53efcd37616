"""GPU paths agree with the CPU ones. Marked `gpu`: skipped cleanly without CUDA."""

import pytest
import torch

from diag.layouts import layout, point

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny import make_drafter, make_prompts, make_target
    root = tmp_path_factory.mktemp("gpu")
    return make_target(root / "t"), make_drafter(root / "d"), make_prompts(root / "p.jsonl")


def _kimi_on_cuda(ks):
    """The kimi_small pair on the device in bf16, the target's experts on the fast kernels."""
    from diag.drafter.checkpoint import load_drafter
    from diag.int4.fast import accelerate
    from diag.int4.load import load_packed_target

    model = load_packed_target(ks.target, dtype=torch.bfloat16, device="cuda")
    accelerate(model)
    return model, load_drafter(ks.drafter, torch.bfloat16, device="cuda")[0]


@torch.no_grad()
def test_capture_and_replay_on_cuda_match_cpu(pair):
    from diag.drafter.checkpoint import load_drafter
    from diag.target.placement import device_map_for
    from diag.replay.replay import Variant, replay
    from diag.target.load import load_embed_and_head, load_target
    from diag.target.passes import Sequence, run_capture
    from diag.trees import tree_shape

    tpath, dpath, _ = pair
    g = torch.Generator().manual_seed(0)
    seqs = [Sequence(f"s{i}", "t", 5, torch.randint(0, 300, (30,), generator=g)) for i in range(4)]
    lay = layout("embed+L2+L3")
    out = {}
    for where in ("cpu", "cuda"):
        dmap = device_map_for(tpath, 1) if where == "cuda" else None
        model, _ = load_target(tpath, dtype=torch.float32, device_map=dmap)
        tp = run_capture(model, seqs, lay.points + (point("final"),), regime="as-loaded", token_budget=64,
                         progress=False)
        drafter, _ = load_drafter(dpath)
        drafter.to(where)
        embed, head = load_embed_and_head(tpath)
        shapes = [tree_shape("chain-3"), tree_shape("s3-k2-d4")]
        res = replay(drafter, embed, head, {"as-loaded": tp}, [Variant(str(lay), "eagle3", s) for s in shapes],
                     {str(lay): lay}, token_budget=64, progress=False)
        out[where] = (tp, res)
    (tc, rc), (tg, rg) = out["cpu"], out["cuda"]
    for name in tc.states:
        for a, b in zip(tc.states[name], tg.states[name]):
            torch.testing.assert_close(a, b.cpu(), rtol=1e-3, atol=1e-3)
    agree = sum(int((a == b.cpu()).sum()) for x, y in zip(rc, rg) for a, b in zip(x.accepted, y.accepted))
    total = sum(len(a) for x in rc for a in x.accepted)
    assert agree / total > 0.97


@torch.no_grad()
def test_int4_zoo_target_fast_experts_on_cuda():
    from diag.target.load import load_target
    from diag.zoo import zoo_path
    path = zoo_path("deepseek-tiny-int4")
    cpu, _ = load_target(path, dtype=torch.bfloat16)
    from diag.target.placement import device_map_for
    gpu, _ = load_target(path, dtype=torch.bfloat16, device_map=device_map_for(path, 1))
    ids = torch.randint(0, 1000, (2, 48))
    a = cpu(ids, output_hidden_states=True).hidden_states
    b = gpu(ids.cuda(), output_hidden_states=True).hidden_states
    for x, y in zip(a, b):
        rel = (x.float() - y.float().cpu()).norm() / x.float().norm()
        assert rel < 3e-2


def test_a_drafter_read_straight_to_the_gpu_equals_one_moved_there(pair):
    """load_drafter(device=cuda): the weights read by checkpoint.reader into CUDA tensors (no
    memory map, no pageable copy) are the CPU load's, moved."""
    from diag.drafter.checkpoint import load_drafter

    _, dpath, _ = pair
    on_gpu, _ = load_drafter(dpath, torch.bfloat16, device="cuda")
    moved = load_drafter(dpath, torch.bfloat16)[0].to("cuda")
    assert all(t.is_cuda for t in on_gpu.state_dict().values())
    for k, v in moved.state_dict().items():
        assert torch.equal(on_gpu.state_dict()[k], v), k


@torch.no_grad()
@pytest.mark.parametrize("tree", ["chain-3", "s3-k4-d8"])
def test_the_verify_replayed_from_cuda_graphs_decodes_what_the_eager_verify_did(kimi_small, tree):
    """Issue 36: the decode loop's verify captured once per bucket (rows, tree, width) and
    replayed (and every other step of a round, per rows and tree), on a Kimi-shaped INT4 target (MLA, the Triton expert kernels, the routing's own
    graphs inside), decodes exactly what the eager verify on the same fixed widths decoded, under
    sampling; and the graphs were used: captured per bucket, replayed every other round, no
    failure. Then the eager verify on growing widths (the CPU's) decodes the same drafts."""
    from diag.bench.cpu import SMALL
    from diag.bench.sampled import bench_loop, bench_prompts
    from diag.engines.decoding import sampled
    from diag.trees import tree_shape

    ks = kimi_small
    model, drafter = _kimi_on_cuda(ks)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    prompts = bench_prompts(12, 10, SMALL["vocab_size"])
    lays = [ks.layout, "L1+L2+final"]
    out = {}
    for name, graphs, fixed in (("graphs", True, True), ("eager", False, True), ("grown", False, False)):
        loop, lanes, rows = bench_loop(model, drafter, embed, head, lays, tree_shape(tree), len(prompts),
                                       decoding=sampled(1.0, 0.95))
        loop.cuda_graphs, loop.fixed_width = graphs, fixed
        loop.verify_ahead_steps = loop.S           # the next verify queued ahead on these trees too (chain-1's default)
        out[name] = (loop.run(prompts, rows, 16), dict(loop.counts), dict(loop.graph_failures))
    got = lambda o: [(d.accepted, d.ids) for d in o]                           # noqa: E731
    (g, gc, gf), (e, ec, _), (w, _, _) = out["graphs"], out["eager"], out["grown"]
    assert gf == {} and gc["verify_graphs_captured"] >= 1
    # the verify is queued ahead behind every commit too (with the draft): each retire and the end drop one
    assert gc["verify_graphs_replayed"] + gc["verify_graphs_captured"] == gc["rounds"] + gc["verifies_discarded"]
    assert gc["verify_graphs_replayed"] > gc["verify_graphs_captured"]
    assert 1 <= gc["verifies_discarded"] <= gc["drafts_discarded"]
    assert "verify_graphs_captured" not in ec
    # the draft, the accept, the commit and the drafter's extend from their graphs too (one group a
    # round: one mode, one tree), the same drafts and draws; no round's top-p pivot past the window
    for step in ("draft", "accept", "commit", "extend"):
        # a draft is queued ahead behind every commit: each retire, and the last round, drops one
        rounds = gc["rounds"] + (gc["drafts_discarded"] if step == "draft" else 0)
        assert gc[f"{step}_graphs_replayed"] + gc[f"{step}_graphs_captured"] == rounds
        assert gc[f"{step}_graphs_replayed"] > gc[f"{step}_graphs_captured"]
    assert "accept_pivots_deeper" not in gc
    assert got(g) == got(e)
    for a, b in zip(g, e):
        torch.testing.assert_close(torch.tensor(a.expected), torch.tensor(b.expected), rtol=0, atol=1e-6)
    same = sum(x == y for x, y in zip(got(g), got(w)))
    assert same >= 0.5 * len(g), f"{same} of {len(g)} rows decoded alike on growing widths (bf16 sums)"


@torch.no_grad()
def test_greedy_steps_replayed_from_a_cuda_graph_continue_as_generate_does(kimi_small):
    """Issue 36: greedy generation on one CUDA device decodes on diag's own cache, each step
    replayed from one graph (target/generate.py): in bf16 on the fast expert kernels it
    continues exactly as the same steps run eagerly, and the graph was captured once and
    replayed every step after; in float32 the graphed steps continue as transformers' generate."""
    from diag.bench.cpu import SMALL
    from diag.bench.sampled import bench_prompts
    from diag.int4.load import load_packed_target
    from diag.target.generate import _left_pad, greedy_continuations, on_cache
    from diag.target.verify_graphs import VerifyGraphs

    from diag.target.mla_latent import latent_mla, latent_wanted
    from diag.target.sdpa import attention_without_cudnn

    model, _ = _kimi_on_cuda(kimi_small)
    prompts = bench_prompts(8, 12, SMALL["vocab_size"], seed=6)
    prompts[2] = prompts[2][:5]                                              # left padding
    graphs = VerifyGraphs()
    dev = next(model.parameters()).device
    with attention_without_cudnn(dev), latent_mla(model, latent_wanted(dev)):   # as greedy_continuations runs it
        graphed = on_cache(model, prompts, 16, 0, graphs=graphs)
        eager = on_cache(model, prompts, 16, 0)
    assert graphs.failure is None and graphs.counts["captured"] == 1 and graphs.counts["replayed"] == 14
    assert graphed == eager
    # (outside those contexts MLA attends over expanded keys: other bf16 sums, another token at a
    # near-tie, as the H100 showed on row 6; each path is held against its own eager steps above)
    assert greedy_continuations(model, prompts, 16, pad_id=0, eos_ids=set(), progress=False) == graphed
    exact = load_packed_target(kimi_small.target, dtype=torch.float32, device="cuda")
    ids, mask = _left_pad(prompts, 0)
    gen = exact.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), do_sample=False, max_new_tokens=16,
                         min_new_tokens=16, pad_token_id=0, eos_token_id=None, num_beams=1,
                         temperature=None, top_p=None, top_k=None)
    assert greedy_continuations(exact, prompts, 16, pad_id=0, eos_ids=set(), progress=False) == \
        gen[:, ids.shape[1]:].tolist()


@torch.no_grad()
def test_mla_over_its_latents_on_cuda_scores_what_the_expanded_keys_score(kimi_small, monkeypatch):
    """target/mla_latent.py on the device (bf16, Kimi-shaped INT4 target, torch's attention with
    one key head shared by the H query heads): a tree verify as close to the float32 truth
    (transformers' expanded MLA in float32 on the device) as transformers' own bf16 path is: the
    first layer's output on average, the logits at the median node (a bf16 sum that moves a token
    to another expert moves its logits far, whichever path: on the CPU in bf16 one node of 64
    moved by 1.2 and doubled the latent path's mean error, its median within 5%), the same argmax
    as often; the decode loop switches both layers by default on CUDA, and decodes at T -> 0
    mostly what the expanded path decodes."""
    from diag.bench.cpu import SMALL
    from diag.bench.sampled import bench_loop, bench_prompts
    from diag.engines.decoding import sampled
    from diag.int4.load import load_packed_target
    from diag.layouts import CapturePoint
    from diag.target.mla_latent import latent_mla
    from diag.target.tree_forward import prefill, verify_forward
    from diag.trees import tree_shape

    ks = kimi_small
    g = torch.Generator().manual_seed(3)
    B, P, parents = 8, 40, torch.tensor([-1, 0, 0, 1, 1, 2, 3, 3])
    D = len(parents)
    ids = torch.randint(5, SMALL["vocab_size"], (B, P), generator=g)
    valid = torch.ones(B, P, dtype=torch.bool)
    tokens = torch.randint(5, SMALL["vocab_size"], (B, D), generator=g)
    logits, first = {}, {}
    points = (CapturePoint("L1"), CapturePoint("final"))
    for dtype, on in ((torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)):
        m = load_packed_target(ks.target, dtype=dtype, device="cuda")
        with latent_mla(m, on):
            kv, _ = prefill(m, ids, valid, points, capacity=P + 2 * D)
            scored = verify_forward(m, kv, tokens, parents.expand(B, D), torch.ones(B, D, dtype=torch.bool),
                                    valid.sum(-1) - 1, points, fixed=True)
            logits[(dtype, on)] = scored.logits.rows(torch.arange(B * D)).float()
            first[(dtype, on)] = scored.states["L1"].float()
        del m
    truth, expanded, latent = logits[(torch.float32, False)], logits[(torch.bfloat16, False)], logits[(torch.bfloat16, True)]
    err = {k: (first[(torch.bfloat16, on)] - first[(torch.float32, False)]).abs().mean().item()
           for k, on in (("expanded", False), ("latent", True))}
    assert err["latent"] <= 1.5 * err["expanded"] + 1e-4, err
    err = {k: (v - truth).abs().median().item() for k, v in (("expanded", expanded), ("latent", latent))}
    assert err["latent"] <= 1.5 * err["expanded"] + 1e-4, err
    agree = {k: (v.argmax(-1) == truth.argmax(-1)).float().mean().item() for k, v in (("expanded", expanded),
                                                                                   ("latent", latent))}
    assert agree["latent"] >= agree["expanded"] - 0.05, agree
    model, drafter = _kimi_on_cuda(ks)
    prompts = bench_prompts(12, 10, SMALL["vocab_size"])
    out = {}
    for value in ("0", None):
        if value is None:
            monkeypatch.delenv("DIAG_MLA_LATENT", raising=False)
        else:
            monkeypatch.setenv("DIAG_MLA_LATENT", value)
        loop, _, rows = bench_loop(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(),
                                   [ks.layout, "L1+L2+final"], tree_shape("chain-3"), len(prompts),
                                   decoding=sampled(1e-7))
        out[value] = ([d.ids for d in loop.run(prompts, rows, 16)], loop.counts["mla_latent_layers"])
    assert out["0"][1] == 0 and out[None][1] == 2
    same = sum(a == b for a, b in zip(out["0"][0], out[None][0]))
    assert same >= 0.5 * len(out["0"][0]), f"{same} of {len(out['0'][0])} rows decoded alike (bf16 sums)"


@torch.no_grad()
def test_a_verify_profile_on_cuda_sees_the_verifys_own_kernels(kimi_small):
    """bench.sampled.verify_profile: the eager verify's kernels (a graph's replay would show as
    one launch), their device time within the verify's wall, their shares summing to at most 1."""
    from diag.bench.cpu import SMALL
    from diag.bench.sampled import bench_prompts, verify_profile

    ks = kimi_small
    model, drafter = _kimi_on_cuda(ks)
    res = verify_profile(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(),
                         [ks.layout, "L1+L2+final"], bench_prompts(8, 10, SMALL["vocab_size"]), "s3-k4-d8",
                         max_new_tokens=24, rounds=3)
    assert res["rounds"] == 3 and res["verify_kernels_per_round"] > 10
    assert 0 < res["verify_device_ms_per_round"] <= res["verify_wall_ms_per_round"] * 1.05 + 0.05
    assert sum(k["share"] for k in res["top_kernels"]) <= 1.0 + 1e-6
    assert res["top_kernels"] and all(k["device_ms_per_round"] > 0 for k in res["top_kernels"])


@torch.no_grad()
def test_a_round_profile_on_cuda_counts_every_kernel_once(kimi_small):
    """bench.sampled.round_profile on the device: the loop's phase ranges carry their kernels'
    time a second time on CUDA (the H100's first profile counted 1.02 of the wall busy), so the
    device's busy time leaves every range out: at most the wall, no range among the top ops,
    and each phase's kernels within its own wall."""
    from diag.bench.cpu import SMALL
    from diag.bench.sampled import RANGES, bench_prompts, round_profile

    ks = kimi_small
    model, drafter = _kimi_on_cuda(ks)
    res = round_profile(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(),
                        [ks.layout, "L1+L2+final"], bench_prompts(8, 10, SMALL["vocab_size"]), "chain-3",
                        max_new_tokens=24, rounds=4)
    assert 0 < res["device_busy_fraction"] <= 1.0
    assert not any(op["op"].startswith(RANGES) for op in res["top_ops"])
    for name, ph in res["phases"].items():
        assert ph["device_ms"] <= ph["host_ms"] * 1.05 + 0.05, (name, ph)


@torch.no_grad()
def test_experts_split_in_shards_on_cuda_compute_what_the_whole_layer_computes(kimi_small):
    """`[placement] experts = "split"` tested on one GPU: every layer's experts in 3 shards (8
    experts -> 3, 3, 2), all on cuda:0, on the fast kernels (each shard's sentinel pairs routed
    nowhere, its partial sum in fp32). The logits equal the unsplit model's to fp32 reassociation
    under bf16 rounding, and greedy generation continues with the same tokens."""
    from diag.int4.fast import FastPackedExperts, accelerate
    from diag.int4.load import load_packed_target
    from diag.int4.packed import PackedExperts
    from diag.int4.sharded import ShardedExperts
    from diag.target.generate import greedy_continuations
    from diag.bench.cpu import SMALL
    from diag.bench.sampled import bench_prompts

    whole, _ = _kimi_on_cuda(kimi_small)
    names = [n for n, m in whole.named_modules() if isinstance(m, PackedExperts)]
    split = load_packed_target(kimi_small.target, dtype=torch.bfloat16,
                               device={"": 0, **{f"{n}.shards.{j}": 0 for n in names for j in range(3)}})
    accelerate(split)
    parts = [split.get_submodule(n) for n in names]
    assert all(isinstance(p, ShardedExperts) and all(type(s) is FastPackedExperts for s in p.shards) for p in parts)
    ids = torch.randint(10, SMALL["vocab_size"], (4, 24), generator=torch.Generator().manual_seed(2)).cuda()
    a, b = whole(ids).logits.float(), split(ids).logits.float()
    assert (a - b).abs().max() <= 0.02 * a.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.98
    prompts = bench_prompts(8, 12, SMALL["vocab_size"], seed=6)
    got = greedy_continuations(split, prompts, 12, pad_id=0, eos_ids=set(), progress=False)
    want = greedy_continuations(whole, prompts, 12, pad_id=0, eos_ids=set(), progress=False)
    assert sum(g == w for g, w in zip(got, want)) >= 7          # a near-tie may turn one row


def test_a_rounds_copy_to_the_host_waits_for_the_copy_not_for_the_work_queued_after_it():
    """decode_rows.to_host: the copy into pinned memory behind an event; the host reads the
    copied bytes after wait(), while work queued after it (the next round's draft) is still
    free to change the source on the device."""
    from diag.replay.decode_rows import to_host

    src = torch.arange(12, device="cuda").view(3, 4)
    host, wait = to_host(src)
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(8):                                       # work behind the copy
        big = big @ big.T / 4096
    src.add_(100)                                            # ... that changes the source after it
    wait()
    assert host.device.type == "cpu" and host.is_pinned()
    assert torch.equal(host, torch.arange(12).view(3, 4))
    assert torch.equal(src.cpu(), torch.arange(12).view(3, 4) + 100)


@torch.no_grad()
def test_one_gpu_of_the_split_on_the_fused_kernels_computes_its_own_shard_and_loops_as_programs(kimi_small):
    """bench/expert_split.OneGpuOfN on the fast kernels (16 experts over 3 shards, busy 1): the
    busy shard's partial sum, the unsplit layer's with the other shards' slots weighted 0 (to bf16
    rounding). The loop with every layer so (round_slope.split_probe's three modes) decodes the
    same draws whether the target's steps replay from one graph each, from programs cut where the
    GPUs hand off (target/device_program.py), or run eagerly; the programs were recorded and
    replayed, with copies between their graphs; the eager one replays no target graph; the
    drafter's steps replay in all three."""
    from diag.bench.expert_split import OneGpuOfN, one_gpu_of
    from diag.bench.round_slope import SPLIT_MODES, TARGET_STEPS, split_probe
    from diag.bench.sampled import bench_loop
    from diag.engines.decoding import sampled
    from diag.int4.packed import PackedExperts
    from diag.trees import tree_shape

    model, drafter = _kimi_on_cuda(kimi_small)
    module = next(m for m in model.modules() if isinstance(m, PackedExperts))
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(64, module.hidden_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
    idx = torch.rand(64, module.num_experts, device="cuda", generator=gen).topk(2, dim=-1).indices
    w = torch.rand(64, 2, device="cuda", generator=gen, dtype=torch.bfloat16)
    one = OneGpuOfN(module, 3, busy=1)                          # before the module's first forward: laid out first
    first, count = one.shards[1].first_expert, one.shards[1].num_experts       # 16 experts -> 6, 5, 5: 6..10
    mine = (idx >= first) & (idx < first + count)
    assert mine.any() and (~mine).any()
    want = module(x, idx, torch.where(mine, w, torch.zeros_like(w))).float()
    got = one(x, idx, w).float()
    assert (got - want).abs().max() <= 0.02 * want.abs().max()
    got = split_probe(model, drafter, kimi_small.layout, 3, busy=1, new_tokens=(4, 8))
    assert "error" not in got, got
    assert all(got[mode]["seconds"] > 0 and got[mode]["long"]["rounds"] > got[mode]["rounds"] for mode in SPLIT_MODES)
    assert got["program"]["program_steps"]["verify_graphs_program_copies"] > 0
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    prompts = torch.randint(10, model.config.vocab_size, (8, 16), generator=torch.Generator().manual_seed(0)).tolist()
    decoded = {}
    with one_gpu_of(model, 3, busy=1):
        for mode in SPLIT_MODES:
            loop, _, rows = bench_loop(model, drafter, embed, head, [kimi_small.layout], tree_shape("chain-1"), 8,
                                       decoding=sampled(1.0, 0.95))
            loop.target_steps = TARGET_STEPS[mode]
            decoded[mode] = [(d.accepted, d.ids) for d in loop.run(prompts, rows, 6)]
            c = loop.counts
            target = [c[f"{step}_graphs_replayed"] for step in ("verify", "accept", "commit")]
            assert (sum(target) == 0) == (mode == "eager") and c["draft_graphs_replayed"] > 0, (mode, dict(c))
            assert loop.graph_failures == {}, loop.graph_failures
            # each MoE layer's experts cut the verify's program: one packed buffer to each of the 2 other shards,
            # their 2 partial sums back
            assert (c["verify_graphs_program_copies"] >= 4) == (mode == "program"), (mode, dict(c))
    assert decoded["program"] == decoded["graphs"] == decoded["eager"]


@torch.no_grad()
def test_a_program_replays_a_forward_cut_where_it_hands_off():
    """target/device_program on one GPU: a forward with two forced hand-offs records as three
    graphs and the two copies between them, and a replay on new inputs computes what the eager
    forward computes on them. With a second GPU, a Tensor.to across the devices cuts it too."""
    from diag.target.device_program import hand_off, record

    gen = torch.Generator(device="cuda").manual_seed(3)
    w = torch.randn(64, 64, device="cuda", generator=gen)

    def forward(x):
        y = torch.relu(x["a"] @ w)
        z = hand_off(y, force=True) * 2
        return {"out": z + hand_off(x["a"], force=True).sum(-1, keepdim=True)}

    inputs = {"a": torch.randn(8, 64, device="cuda", generator=gen)}
    forward(inputs)                                                     # the first call, eager
    program, out = record(forward, inputs, {})
    assert program.counts() == {"graphs": 3, "copies": 2}
    new = torch.randn(8, 64, device="cuda", generator=gen)
    inputs["a"].copy_(new)
    program.replay()
    torch.testing.assert_close(out["out"], forward({"a": new})["out"])
    program, out = record(lambda x: {"out": _cut_between(x["a"])}, inputs, {})     # a boundary, no copy
    assert program.counts() == {"graphs": 2, "copies": 0}
    inputs["a"].copy_(new * 3)
    program.replay()
    torch.testing.assert_close(out["out"], new * 6 + 1)
    if torch.cuda.device_count() < 2:
        return

    def across(x):
        y = (x["a"] @ w).to("cuda:1") * 3                               # a cut: GPU 0's graph, a copy, GPU 1's
        return {"out": y.to("cuda:0") + 1}
    across(inputs)
    program, out = record(across, inputs, {}, devices=[0, 1])
    assert program.counts()["copies"] == 2 and program.counts()["graphs"] >= 3
    inputs["a"].copy_(torch.randn(8, 64, device="cuda", generator=gen))
    program.replay()
    torch.testing.assert_close(out["out"], across({"a": inputs["a"].clone()})["out"])


def _cut_between(a):
    from diag.target.device_program import cut

    y = a * 2
    cut()
    return y + 1
