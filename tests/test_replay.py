"""Replay on a tiny random target: capture equals output_hidden_states, and the batched
replay's per-round counts equal a one-sequence-at-a-time reference."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from diag.target.capture import capture_pass, chunked_argmax
from diag.drafter.model import DrafterConfig, Eagle3Drafter
from diag.drafter.drafting import DraftHead, DraftInputs, draft_beam, draft_chain
from diag.layouts import layout, point
from diag.replay.replay import Variant, eval_roots, replay
from diag.target.passes import Sequence, budget_batches, run_capture
from diag.drafter.tree_build import finalize
from diag.trees import tree_shape
from diag.replay.verify import accepted_chain, target_next_windows

V, H, N = 64, 32, 4


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=N,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def drafter():
    torch.manual_seed(1)
    d = Eagle3Drafter(DrafterConfig(hidden_size=H, num_attention_heads=4, num_key_value_heads=4,
                                    intermediate_size=48, vocab_size=V, draft_vocab_size=40,
                                    target_hidden_size=H, num_aux=3))
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.2)
    d.set_vocab(torch.arange(40) + 10)
    return d.eval()


def sequences(n=5, seed=3):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = int(torch.randint(3, 9, (1,), generator=g))
        t = p + int(torch.randint(6, 14, (1,), generator=g))
        out.append(Sequence(f"p{i}", "test", p, torch.randint(0, V, (t,), generator=g)))
    return out


@torch.no_grad()
def test_capture_equals_output_hidden_states(target):
    seq = sequences(1)[0].ids[None]
    points = (point("embed"), point("L1"), point("L3"), point(f"L{N}"), point("final"))
    got = capture_pass(target, seq, torch.ones_like(seq), points)
    ref = target(seq, output_hidden_states=True)
    hs = ref.hidden_states
    torch.testing.assert_close(got.states["embed"], hs[0])
    torch.testing.assert_close(got.states["L1"], hs[1])
    torch.testing.assert_close(got.states["L3"], hs[3])
    torch.testing.assert_close(got.states["final"], hs[N])
    # L{N} is the last layer's output before the final norm: normalising it gives `final`
    torch.testing.assert_close(target.model.norm(got.states[f"L{N}"]), hs[N])
    assert torch.equal(got.argmax[0], ref.logits[0].argmax(-1))


def test_chunked_argmax_matches_full(target):
    h = torch.randn(7, H)
    full = target.lm_head(h).argmax(-1)
    assert torch.equal(chunked_argmax(h, target.lm_head, chunk=5), full)


def test_budget_batches_worked_example():
    assert budget_batches([5, 9, 3, 8], 18) == [[1, 3], [0, 2]]


def test_eval_roots_worked_example():
    assert list(eval_roots(5, 12, 3)) == [4, 5, 6, 7]


@torch.no_grad()
def test_batched_replay_equals_per_sequence_reference(target, drafter):
    seqs = sequences()
    lay = layout("embed+L1+L3")
    tp = run_capture(target, seqs, lay.points + (point("final"),), regime="as-loaded",
                     token_budget=40, progress=False)
    shapes = [tree_shape("chain-1"), tree_shape("chain-3")]
    res = replay(drafter, target.get_input_embeddings(), target.lm_head, {"as-loaded": tp},
                 [Variant(str(lay), "eagle3", s) for s in shapes], {str(lay): lay},
                 token_budget=40, progress=False)
    for i, s in enumerate(seqs):
        aux = torch.cat([tp.states[p.name][i] for p in lay.points], -1)[None]
        toks = torch.cat([s.ids[1:], s.ids[-1:]])[None]
        logits = drafter.unroll(target.get_input_embeddings(), aux, toks, 3)
        draft = torch.stack([drafter.to_target_ids(l.argmax(-1)) for l in logits], -1)[0]
        roots = list(eval_roots(s.prompt_len, len(s.ids), 3))
        win = target_next_windows(tp.argmax[i], 3)[roots]
        for shape, r in zip(shapes, res):
            want = accepted_chain(draft[roots][:, :shape.num_steps], win[:, :shape.num_steps])
            assert torch.equal(r.accepted[i], want), (shape, i)
            assert r.roots[i].tolist() == roots


@torch.no_grad()
def test_batched_tree_replay_equals_per_sequence_reference(target, drafter):
    """Beams drafted only at each sequence's own roots, several sequences of different
    prompt lengths in one batch, equal one sequence drafted at every index on its own."""
    from diag.replay.verify import accepted_tree
    seqs = sequences(6, seed=5)
    lay = layout("embed+L1+L3")
    tp = run_capture(target, seqs, lay.points, regime="as-loaded", token_budget=200, progress=False)
    shapes = [tree_shape("s2-k2-d4"), tree_shape("s3-k3-d6"), tree_shape("chain-2")]
    res = replay(drafter, target.get_input_embeddings(), target.lm_head, {"as-loaded": tp},
                 [Variant(str(lay), "eagle3", s) for s in shapes], {str(lay): lay},
                 token_budget=200, progress=False)
    dh = DraftHead(target.get_input_embeddings())
    for i, s in enumerate(seqs):
        aux = torch.cat([tp.states[p.name][i] for p in lay.points], -1)[None]
        toks = torch.cat([s.ids[1:], s.ids[-1:]])[None]
        x = DraftInputs(aux, toks, torch.ones_like(toks, dtype=torch.bool),
                        torch.arange(len(s.ids))[None])
        roots = list(eval_roots(s.prompt_len, len(s.ids), 3))
        win = target_next_windows(tp.argmax[i], 3)[roots]
        for shape, r in zip(shapes, res):
            if shape.topk == 1:
                want = accepted_chain(draft_chain(drafter, dh, x, shape.num_steps)[0, roots],
                                      win[:, :shape.num_steps])
            else:
                hist = draft_beam(drafter, dh, x, shape.num_steps, shape.topk)
                tree = finalize([_rows_of(b, roots) for b in hist], shape.num_draft_tokens)
                want = accepted_tree(tree, win[:, :shape.num_steps])
            assert torch.equal(r.accepted[i], want), (shape, i)
            assert r.roots[i].tolist() == roots


def _rows_of(beam, rows):
    from dataclasses import fields, replace
    return replace(beam, **{f.name: getattr(beam, f.name)[rows] for f in fields(beam) if f.name != "step"})


@torch.no_grad()
def test_topk1_beam_equals_chain(target, drafter):
    seqs = sequences(2)
    lay = layout("L1+L2+L3")
    tp = run_capture(target, seqs, lay.points, regime="x", token_budget=100, progress=False)
    from diag.target.passes import pad_right
    aux, valid = pad_right([torch.cat([tp.states[p.name][i] for p in lay.points], -1) for i in range(2)])
    toks, _ = pad_right([torch.cat([s.ids[1:], s.ids[-1:]]) for s in seqs])
    x = DraftInputs(aux, toks, valid, torch.arange(2, aux.shape[1]).expand(2, -1))
    dh = DraftHead(target.get_input_embeddings())
    chain = draft_chain(drafter, dh, x, 3)                                  # [B, Q, 3]
    tree = finalize(draft_beam(drafter, dh, x, 3, 1), 4)
    assert torch.equal(tree.tokens[:, 1:].view(chain.shape), chain)
    assert tree.parents[0].tolist() == [-1, 0, 1, 2]


@torch.no_grad()
def test_eagle_mode_uses_final_state_and_target_head(target, drafter):
    seqs = sequences(2)
    tp = run_capture(target, seqs, (point("final"),), regime="as-loaded", token_budget=100, progress=False)
    v = Variant("final", "eagle", tree_shape("chain-2"))
    (res,) = replay(drafter, target.get_input_embeddings(), target.lm_head, {"as-loaded": tp}, [v],
                    {"final": layout("final")}, progress=False)
    s = seqs[0]
    aux = tp.states["final"][0][None]
    toks = torch.cat([s.ids[1:], s.ids[-1:]])[None]
    limited = lambda x: target.lm_head(x)[..., :40]   # noqa: E731  draft_vocab_size 40 (draft_tables.py)
    logits = drafter.unroll(target.get_input_embeddings(), aux, toks, 2, head=limited)
    draft = torch.stack([l.argmax(-1) for l in logits], -1)[0]              # target ids, no d2t
    roots = list(eval_roots(s.prompt_len, len(s.ids), 2))
    want = accepted_chain(draft[roots], target_next_windows(tp.argmax[0], 2)[roots])
    assert torch.equal(res.accepted[0], want)


def _chain_drafts(drafter, embed, head, tp, seqs, mode, lay, tables=None):
    """Depth-2 chain drafts at every index of sequence 0, through replay's own draft_head."""
    from diag.replay.replay import default_tables, draft_head, layout_features
    t = (tables or {}).get(mode) or default_tables(drafter, mode)
    dh = draft_head(drafter, embed, head, t, torch.device("cpu"), torch.float32)
    s = seqs[0]
    x = DraftInputs(layout_features(tp, lay, mode, 0)[None], torch.cat([s.ids[1:], s.ids[-1:]])[None],
                    torch.ones(1, len(s.ids), dtype=torch.bool), torch.arange(len(s.ids))[None])
    return draft_chain(drafter, dh, x, 2)[0]                                 # [T, 2] target ids


@torch.no_grad()
def test_eagle_drafts_only_the_first_draft_vocab_ids(target, drafter):
    """SGLang keeps vocab_size = draft_vocab_size for the draft logits: with the target's head
    under EAGLE, drafts are target ids 0..39 (draft_vocab_size 40 of 64)."""
    from diag.engines.sglang.draft_tables import draft_tables
    seqs = sequences(3)
    tp = run_capture(target, seqs, (point("final"),), regime="as-loaded", token_budget=100, progress=False)
    lay = layout("final")
    limited = _chain_drafts(drafter, target.get_input_embeddings(), target.lm_head, tp, seqs, "eagle", lay)
    assert int(limited.max()) < 40
    full = draft_tables("eagle", hidden_size=H, target_hidden_size=None, draft_vocab_size=None, vocab_size=V)
    unlimited = _chain_drafts(drafter, target.get_input_embeddings(), target.lm_head, tp, seqs, "eagle", lay,
                              {"eagle": full})
    assert int(unlimited.max()) >= 40          # the full vocabulary would have drafted other ids


@torch.no_grad()
def test_drafter_embed_tokens_used_only_when_sglang_keeps_them(target, drafter):
    """A drafter that ships its own embed_tokens drafts with the TARGET's table (set_embed),
    unless target_hidden_size != hidden_size (draft_tables.py)."""
    from diag.engines.sglang.draft_tables import draft_tables
    seqs = sequences(2)
    lay = layout("embed+L1+L3")
    tp = run_capture(target, seqs, lay.points, regime="as-loaded", token_budget=100, progress=False)
    own = torch.nn.Embedding(V, H)
    torch.nn.init.normal_(own.weight, std=1.0)
    drafter.embed_tokens = own
    try:
        served = _chain_drafts(drafter, target.get_input_embeddings(), target.lm_head, tp, seqs, "eagle3", lay)
        with_target = _chain_drafts(drafter, target.get_input_embeddings(), target.lm_head, tp, seqs, "eagle3",
                                    lay, {"eagle3": draft_tables("eagle3", hidden_size=H, target_hidden_size=None,
                                                                 draft_vocab_size=40, vocab_size=V)})
        keep = draft_tables("eagle3", hidden_size=H, target_hidden_size=2 * H, draft_vocab_size=40, vocab_size=V)
        with_own = _chain_drafts(drafter, target.get_input_embeddings(), target.lm_head, tp, seqs, "eagle3",
                                 lay, {"eagle3": keep})
    finally:
        drafter.embed_tokens = None
    assert torch.equal(served, with_target)
    assert not torch.equal(with_own, with_target)


@torch.no_grad()
@pytest.mark.parametrize("mode", ["eagle3", "eagle"])
def test_padded_features_equal_cat_then_pad_then_convert(target, mode):
    """padded_features builds the drafter's [B, T_max, W] input in place: the same values as
    pad_right(layout_features), converted to the drafter's dtype afterwards."""
    from diag.replay.replay import layout_features, padded_features
    from diag.target.passes import pad_right

    seqs = sequences()
    lay = layout("embed+L1+L3")
    tp = run_capture(target, seqs, lay.points + (point("final"),), regime="as-loaded",
                     token_budget=40, progress=False)
    idx = [3, 0, 4]
    want, want_valid = pad_right([layout_features(tp, lay, mode, i) for i in idx])
    got, valid = padded_features(tp, lay, mode, idx, torch.device("cpu"), torch.bfloat16)
    assert torch.equal(got, want.to(torch.bfloat16)) and torch.equal(valid, want_valid)


def test_embedding_stays_put_on_cpu_and_when_the_gpu_is_short(monkeypatch):
    from diag.replay import replay as rp

    emb = torch.nn.Embedding(10, 4)
    assert rp.embedding_near(emb, torch.device("cpu")) is emb
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (100, 1000))   # 160 B > 25 of 100
    assert rp.embedding_near(emb, torch.device("cuda", 0)) is emb
