"""The zoo: deterministic builders, real on-disk formats, drafters that declare their layout.

Fast tests run the real builders on tiny recipes (a 120 kB corpus, 2-layer models, a
few steps). Tests over the real zoo call zoo_path, which builds on first use (about
4 minutes on 2 uncontended cores: `diag bench cpu --sections zoo`) and reuses the cache
afterwards; they carry the `slow` mark only while something is still unbuilt."""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from diag.errors import DiagError
from diag.layouts import layout
from diag.zoo import ZOO, cache, is_built, zoo_path
from diag.zoo import tokenizer as tk
from diag.zoo.build import closure, read_meta
from diag.zoo.build_drafters import build_drafter, hot_vocab, specforge_ids, views
from diag.zoo.build_targets import ExpertBalancer, build_corpus, build_target, load_back
from diag.zoo.corpus import collect
from diag.zoo.quality import distinct_2, loop_period
from diag.zoo.recipes import (CorpusRecipe, DeepseekShape, DerivedDrafterRecipe, DrafterRecipe, Int4Recipe,
                              LlamaShape, TargetRecipe, TrainBudget)
from diag.zoo.targets import new_model, per_expert_state
from diag.zoo.train import lr_at

TINY_CORPUS = CorpusRecipe(byte_budget=120_000, max_file_bytes=4000, heldout_every=5, vocab_size=320)
TINY_BUDGET = TrainBudget(steps=3, batch=2, seq_len=32, lr=1e-3, warmup=1, seed=7)
TINY_SHAPES = {
    "llama": LlamaShape(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                        intermediate_size=64, max_position_embeddings=256),
    "deepseek": DeepseekShape(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, q_lora_rank=16,
                              kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                              intermediate_size=64, moe_intermediate_size=32, n_routed_experts=4,
                              num_experts_per_tok=2, max_position_embeddings=256),
}
TINY_DRAFTER = DrafterRecipe("t", "embed+L1", TrainBudget(steps=3, batch=2, seq_len=16, lr=1e-3, warmup=1, seed=5),
                             draft_vocab_size=64, pool_sequences=4, eval_sequences=2)


def _bytes(path: Path) -> bytes:
    return (path / "model.safetensors").read_bytes()


# ---- pure pieces: golden examples ----------------------------------------------------

def test_hot_vocab_golden():
    assert hot_vocab(torch.tensor([5, 9, 0, 9]), 2).tolist() == [1, 3]
    assert hot_vocab(torch.tensor([1, 1, 1]), 2).tolist() == [0, 1]      # ties -> lower id


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=40), st.data())
def test_hot_vocab_takes_the_most_frequent(counts, data):
    size = data.draw(st.integers(1, len(counts)))
    hot = hot_vocab(torch.tensor(counts), size)
    assert hot.tolist() == sorted(set(hot.tolist())) and len(hot) == size
    cold = [c for i, c in enumerate(counts) if i not in set(hot.tolist())]
    assert not cold or min(counts[i] for i in hot.tolist()) >= max(cold)


def test_specforge_ids_golden():
    assert specforge_ids(layout("embed+L2+L4")) == [-1, 1, 3]
    assert specforge_ids(layout("L1+L3+L5")) == [0, 2, 4]


def test_views_worked_example():
    """steps 3, L 10 -> T 7; j = 2: token x3, teacher x4 x5, labels argmax 3, 4, 5."""
    seqs = torch.arange(10)[None]                                  # [1, 10]
    argmax = 100 + torch.arange(10)[None]
    aux = torch.arange(10.)[None, :, None]                         # [1, 10, 1]
    a, tokens, teacher, labels = views(seqs, aux, argmax, 3)
    assert a.shape == (1, 7, 1) and a[0, 2, 0] == 2
    assert tokens[0, 2] == 3 and teacher[0, 2].tolist() == [4, 5] and labels[0, 2].tolist() == [103, 104, 105]
    assert labels[0, -1].tolist() == [107, 108, 109]               # last index uses the last argmax


@pytest.mark.parametrize("kind", ["llama", "deepseek"])
def test_greedy_pools_are_the_dynamic_caches_tokens(kind):
    """greedy_sequences generates llama pools with a static KV cache (faster on CPU): the ids are
    those of generate's default dynamic cache, so the pools, and the drafters trained on them,
    are what they were; deepseek keeps the dynamic cache."""
    from diag.zoo.build_drafters import STATIC_CACHE_MODELS, greedy_sequences
    torch.manual_seed(3)
    model = new_model(TargetRecipe("c", TINY_SHAPES[kind], TINY_BUDGET, "float32"), 320,
                      {"<|bos|>": 1, "<|eos|>": 2, "<|pad|>": 0}).eval()
    prompts = torch.randint(3, 320, (6, 20))
    got = greedy_sequences(model, prompts, 30)
    want = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                          max_new_tokens=30, min_new_tokens=30)
    assert got.shape == (6, 50) and torch.equal(got, want)
    assert (model.config.model_type in STATIC_CACHE_MODELS) == (kind == "llama")


def test_greedy_continuations_are_remembered_per_target_identity(monkeypatch):
    """The embed drafter and its control draw the same pool from one target: the second build
    takes the first's continuations. Remembered only under an identity, per (identity, prompts,
    new tokens), and handed out as copies."""
    from diag.zoo import build_drafters as bd
    monkeypatch.setattr(bd, "_CONTINUATIONS", {})
    torch.manual_seed(3)
    model = new_model(TargetRecipe("c", TINY_SHAPES["llama"], TINY_BUDGET, "float32"), 320,
                      {"<|bos|>": 1, "<|eos|>": 2, "<|pad|>": 0}).eval()
    calls = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kw: calls.append(1) or generate(**kw))
    prompts = torch.randint(3, 320, (4, 9))
    first = bd.greedy_sequences(model, prompts, 6, identity="t1")
    first[0, 0] = -1                                                       # a copy: the memo is untouched
    again = bd.greedy_sequences(model, prompts, 6, identity="t1")
    assert len(calls) == 1 and again[0, 0] == prompts[0, 0] and torch.equal(again[:, 9:], first[:, 9:])
    bd.greedy_sequences(model, prompts, 7, identity="t1")                  # other length
    bd.greedy_sequences(model, prompts[:3], 6, identity="t1")             # other prompts
    bd.greedy_sequences(model, prompts, 6, identity="t2")                 # another target
    bd.greedy_sequences(model, prompts, 6)                                # no identity: never remembered
    bd.greedy_sequences(model, prompts, 6)
    assert len(calls) == 6


def test_target_identity_changes_when_the_target_is_rewritten(tmp_path):
    from diag.zoo.build_drafters import target_identity
    assert target_identity(tmp_path) is None
    (tmp_path / "zoo_meta.json").write_text(json.dumps({"fingerprint": "abc"}))
    assert target_identity(tmp_path) is None                              # no weights
    (tmp_path / "model.safetensors").write_bytes(b"12345")
    first = target_identity(tmp_path)
    assert '"abc"' in first and '"size": 5' in first
    time.sleep(0.01)
    (tmp_path / "model.safetensors").write_bytes(b"12345")
    assert target_identity(tmp_path) != first


def test_target_distribution_in_pieces_is_the_same_bits(tiny_targets, monkeypatch):
    """capture computes the distribution DIST_ROWS sequences at a time (under glibc's mmap
    threshold): bitwise what one piece gives."""
    from diag.zoo import build_drafters as bd
    model = load_back(tiny_targets["llama"][0])
    seqs = torch.randint(0, model.config.vocab_size, (5, 12), generator=torch.Generator().manual_seed(1))
    hot = torch.tensor([1, 5, 7, 40, 99, 200])
    monkeypatch.setattr(bd, "DIST_ROWS", 1000)
    whole = bd.target_distribution(model, seqs, hot, temperature=0.5)
    monkeypatch.setattr(bd, "DIST_ROWS", 2)
    assert torch.equal(bd.target_distribution(model, seqs, hot, temperature=0.5), whole)


def test_deterministic_skips_the_nan_fill_and_restores_it():
    from diag.zoo.train import deterministic
    before = torch.utils.deterministic.fill_uninitialized_memory
    with deterministic(0):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is False
    assert torch.utils.deterministic.fill_uninitialized_memory == before


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_allocator_keeps_freed_memory_under_glibc():
    from diag.zoo.allocator import keep_freed_memory
    assert keep_freed_memory() is True and keep_freed_memory() is True   # accepted, and idempotent


def test_quality_measures_golden():
    assert distinct_2([1, 2, 3, 4]) == 1.0
    assert loop_period([9] * 8 + [5, 6, 7] * 12) == 3
    assert loop_period(list(range(40))) == 0
    assert distinct_2([1, 2] * 10) == pytest.approx(2 / 19)


def test_lr_schedule_worked_example():
    b = TrainBudget(steps=170, batch=1, seq_len=1, lr=3e-3, warmup=20, min_lr_ratio=0.1)
    assert lr_at(9, b) == pytest.approx(1.5e-3)
    assert lr_at(95, b) == pytest.approx(1.65e-3)
    assert lr_at(169, b) == pytest.approx(3.0e-4, rel=0.01)


def test_training_runs_under_an_outer_no_grad():
    """A zoo entry first asked for inside a `torch.no_grad()` test is built there: optimize
    turns gradients on for its own steps (the GPU suite's first build on a bare machine
    failed with "element 0 of tensors does not require grad")."""
    from diag.zoo.recipes import TrainBudget
    from diag.zoo.train import optimize

    w = torch.nn.Parameter(torch.tensor([3.0]))
    with torch.no_grad():
        losses = optimize([w], TrainBudget(steps=5, batch=1, seq_len=1, lr=0.1, warmup=0),
                          lambda _s: (w ** 2).sum(), desc="t")
        assert not torch.is_grad_enabled()
    assert len(losses) == 5 and losses[-1] < losses[0] and float(w.detach()) < 3.0


def test_per_expert_state_golden():
    """gate_up [E=2, 2I=4, H=3] -> gate rows 0..1, up rows 2..3; down [E, H, I] per expert."""
    gate_up = torch.arange(24.).view(2, 4, 3)
    down = torch.arange(12.).view(2, 3, 2)
    out = per_expert_state({"model.layers.1.mlp.experts.gate_up_proj": gate_up,
                            "model.layers.1.mlp.experts.down_proj": down, "model.norm.weight": torch.ones(3)})
    assert sorted(out) == sorted(["model.norm.weight"] + [f"model.layers.1.mlp.experts.{e}.{k}_proj.weight"
                                                          for e in (0, 1) for k in ("gate", "up", "down")])
    assert torch.equal(out["model.layers.1.mlp.experts.1.gate_proj.weight"], gate_up[1, :2])
    assert torch.equal(out["model.layers.1.mlp.experts.1.up_proj.weight"], gate_up[1, 2:])
    assert torch.equal(out["model.layers.1.mlp.experts.0.down_proj.weight"], down[0])


def test_closure_puts_dependencies_first():
    assert closure(["llama-tiny-eagle3-l1"]) == ["stdlib-corpus", "llama-tiny", "llama-tiny-eagle3-l1"]
    assert closure(["deepseek-tiny-int4", "deepseek-tiny"]) == ["stdlib-corpus", "deepseek-tiny",
                                                                "deepseek-tiny-int4"]
    with pytest.raises(DiagError, match="unknown zoo entry"):
        closure(["llama-huge"])


def test_recipes_are_consistent():
    for e in ZOO.values():
        assert all(n in ZOO for n in e.needs), e.name
        r = e.recipe
        if isinstance(r, DrafterRecipe):
            layout(r.layout).check_against(ZOO[r.target].recipe.shape.num_hidden_layers)
        if isinstance(r, DerivedDrafterRecipe):
            assert isinstance(ZOO[r.source].recipe, DrafterRecipe), e.name
        if isinstance(r, Int4Recipe):
            s = ZOO[r.source].recipe.shape
            assert s.hidden_size % r.group_size == 0 and s.moe_intermediate_size % r.group_size == 0


# ---- cache: atomic, locked ---------------------------------------------------------

@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_root_honours_env(cache_dir):
    assert cache.cache_root() == cache_dir / "zoo" / f"v{cache.BUILDER_VERSION}"


def test_failed_build_leaves_nothing(cache_dir):
    def boom(tmp: Path):
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("interrupted")
    with pytest.raises(RuntimeError):
        cache.publish("e", boom)
    assert not cache.is_built("e")
    assert [p.name for p in cache.cache_root().iterdir()] == [".e.lock"]
    (cache.cache_root() / ".e.tmp-killed").mkdir()                         # a SIGKILLed build's leftovers
    path, now = cache.publish("e", lambda tmp: (tmp / "ok").write_text("1"))
    assert now and (path / "ok").read_text() == "1"
    assert not list(cache.cache_root().glob(".e.tmp-*"))
    assert (path.stat().st_mode & 0o777, (path / "ok").stat().st_mode & 0o777) == (0o755, 0o644)
    assert cache.publish("e", lambda tmp: pytest.fail("rebuilt"))[1] is False


def _slow_build(log: str) -> str:
    def work(tmp: Path):
        with open(log, "a") as fh:
            fh.write("built\n")
        time.sleep(0.4)
        (tmp / "done").write_text("1")
    return str(cache.publish("shared", work)[0])


def test_two_processes_build_once(cache_dir, tmp_path):
    log = str(tmp_path / "log.txt")
    with multiprocessing.get_context("fork").Pool(2) as pool:
        paths = pool.map(_slow_build, [log, log])
    assert paths[0] == paths[1]
    assert Path(log).read_text() == "built\n"


@pytest.fixture
def stub_zoo(cache_dir, monkeypatch):
    """Two cheap entries, a corpus and a target built from it, whose builder writes the recipe's
    byte budget / steps and logs each build (the real builders are not run)."""
    from diag.zoo import build
    target = TargetRecipe("c", TINY_SHAPES["llama"], TINY_BUDGET, "float32")
    monkeypatch.setitem(ZOO, "c", dataclasses.replace(ZOO["stdlib-corpus"], name="c", recipe=TINY_CORPUS))
    monkeypatch.setitem(ZOO, "t", dataclasses.replace(ZOO["llama-tiny"], name="t", recipe=target))
    log = []

    def builder(name, out, deps):
        log.append(name)
        (out / "made").write_text(repr(ZOO[name].recipe))
        return {}

    monkeypatch.setattr(build, "_run_builder", builder)
    return log


def _recipe(name: str, **change):
    ZOO[name] = dataclasses.replace(ZOO[name], recipe=dataclasses.replace(ZOO[name].recipe, **change))


def test_a_changed_recipe_rebuilds_its_entry_and_what_is_built_from_it(stub_zoo):
    from diag.zoo.build import ensure, fingerprint, stale
    ensure(["t"], progress=False)
    assert stub_zoo == ["c", "t"] and stale("t") is None
    ensure(["t"], progress=False)
    assert stub_zoo == ["c", "t"]                                        # served from the cache
    before = fingerprint("t")
    _recipe("c", byte_budget=130_000)                                    # upstream change
    assert fingerprint("t") != before and stale("c") == stale("t") == "its recipe or one it needs changed"
    ensure(["t"], progress=False)
    assert stub_zoo == ["c", "t", "c", "t"] and stale("t") is None
    assert "130000" in (cache.entry_dir("c") / "made").read_text()
    _recipe("t", budget=dataclasses.replace(TINY_BUDGET, steps=4))       # the target alone
    ensure(["t"], progress=False)
    assert stub_zoo[4:] == ["t"]


def test_an_entry_from_before_fingerprints_is_kept_while_its_recipe_is(stub_zoo):
    from diag.zoo.build import META_FILE, ensure, stale
    ensure(["t"], progress=False)
    for n in ("c", "t"):                                                 # as an older diag wrote them
        f = cache.entry_dir(n) / META_FILE
        meta = json.loads(f.read_text())
        del meta["fingerprint"]
        f.write_text(json.dumps(meta))
    assert stale("c") is None and stale("t") is None
    assert stale("t", {"c"}) == "c was rebuilt"
    _recipe("c", heldout_every=6)
    assert stale("c") == "its recipe changed"
    ensure(["t"], progress=False)
    assert stub_zoo == ["c", "t", "c", "t"]                              # c changed, so t is rebuilt too


def test_zoo_list_names_a_stale_entry(stub_zoo, capsys):
    from diag.cli.main import main
    from diag.zoo.build import ensure
    ensure(["t"], progress=False)
    _recipe("t", save_dtype="bfloat16")
    assert main(["zoo", "list"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.split()[:1] == ["t"])
    assert "stale (rebuilt on use)" in line


# ---- corpus and tokenizer --------------------------------------------------------------

def _fake_stdlib(root: Path) -> None:
    for rel in ["a.py", "pkg/b.py", "pkg/c.py", "test/test_a.py", "site-packages/x.py",
                "encodings/cp1.py", "_sysconfigdata_x.py", "big.py"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n" + "x = 1\n" * (400 if rel == "big.py" else 5))


def test_corpus_is_deterministic_and_skips_non_source(tmp_path):
    _fake_stdlib(tmp_path)
    recipe = CorpusRecipe(byte_budget=10_000, max_file_bytes=100, heldout_every=2)
    a, b = collect(recipe, tmp_path), collect(recipe, tmp_path)
    assert a == b
    paths = sorted(d.path for d in a.train + a.heldout)
    assert paths == ["a.py", "big.py", "pkg/b.py", "pkg/c.py"]
    big = next(d for d in a.train + a.heldout if d.path == "big.py")
    assert len(big.text.encode()) <= 100 and big.text.endswith("\n")     # cut at a line boundary
    tight = collect(dataclasses.replace(recipe, byte_budget=60), tmp_path)
    assert tight.num_bytes <= 60


def test_tokenizer_is_deterministic_and_loads_with_chat_template(tmp_path):
    texts = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n", "import os\nprint(os.sep)\n"] * 30
    one, two = tk.train_tokenizer(texts, TINY_CORPUS), tk.train_tokenizer(texts, TINY_CORPUS)
    assert one.to_str() == two.to_str()
    tk.save_tokenizer(one, tmp_path, TINY_CORPUS)
    from transformers import AutoTokenizer
    auto = AutoTokenizer.from_pretrained(tmp_path)
    assert (auto.bos_token, auto.eos_token, auto.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert auto("def f")["input_ids"][0] == tk.special_ids(one)["<|bos|>"]
    chat = auto.apply_chat_template([{"role": "user", "content": "import os"}], add_generation_prompt=True,
                                    tokenize=False)
    assert chat == "<|bos|><|user|>\nimport os<|end|>\n<|assistant|>\n"
    assert tk.chat_document("import os", "x = 1\n").startswith(chat)


# ---- builders are deterministic (real builders, tiny recipes) --------------------------

@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    build_corpus(TINY_CORPUS, out)
    return out


def _tiny_target(kind: str, corpus: Path, out: Path, seed: int = 7) -> dict:
    budget = dataclasses.replace(TINY_BUDGET, seed=seed)
    recipe = TargetRecipe("c", TINY_SHAPES[kind], budget, "float32" if kind == "llama" else "bfloat16")
    out.mkdir()
    return build_target(recipe, out, {"c": corpus})


@pytest.fixture(scope="module")
def tiny_targets(tiny_corpus, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """One tiny llama and one tiny deepseek, built once for the module."""
    root = tmp_path_factory.mktemp("targets")
    return {k: (root / k, _tiny_target(k, tiny_corpus, root / k)) for k in TINY_SHAPES}


@pytest.mark.parametrize("kind", ["llama", "deepseek"])
def test_target_builder_is_deterministic(kind, tiny_corpus, tiny_targets, tmp_path):
    first, meta = tiny_targets[kind]
    again = _tiny_target(kind, tiny_corpus, tmp_path / "again")
    assert _bytes(first) == _bytes(tmp_path / "again")
    assert meta["heldout_perplexity"] == again["heldout_perplexity"]
    if kind == "llama":                                                  # the seed matters
        _tiny_target(kind, tiny_corpus, tmp_path / "other", seed=8)
        assert _bytes(first) != _bytes(tmp_path / "other")


def test_drafter_builder_is_deterministic(tiny_corpus, tiny_targets, tmp_path):
    deps = {"t": tiny_targets["llama"][0], "c": tiny_corpus}
    for name in ("a", "b"):
        build_drafter(TINY_DRAFTER, tmp_path / name, deps, corpus="c")
    assert _bytes(tmp_path / "a") == _bytes(tmp_path / "b")
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["diag_trained_layout"] == "embed+L1"
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 0]


def test_drafter_builder_with_the_distribution_loss_in_bf16_is_deterministic(tiny_corpus, tiny_targets, tmp_path):
    """The llama-tiny drafters' recipe options: SpecForge's loss and bf16 autocast. Two builds
    are the same bytes, and they differ from the argmax / float32 build."""
    deps = {"t": tiny_targets["llama"][0], "c": tiny_corpus}
    recipe = dataclasses.replace(TINY_DRAFTER, loss="distribution",
                                 budget=dataclasses.replace(TINY_DRAFTER.budget, compute_dtype="bfloat16"))
    for name in ("a", "b"):
        build_drafter(recipe, tmp_path / name, deps, corpus="c")
    build_drafter(TINY_DRAFTER, tmp_path / "plain", deps, corpus="c")
    assert _bytes(tmp_path / "a") == _bytes(tmp_path / "b") != _bytes(tmp_path / "plain")
    with pytest.raises(DiagError, match="loss"):
        build_drafter(dataclasses.replace(TINY_DRAFTER, loss="kl"), tmp_path / "bad", deps, corpus="c")


def test_target_distribution_is_transformers_softmax_over_the_hot_ids(tiny_targets):
    """target_distribution against the model's own logits (transformers' forward): the softmax
    of the logits at the hot ids, renormalised there, at temperature 1 and 0.5."""
    from diag.zoo.build_drafters import target_distribution
    model = load_back(tiny_targets["llama"][0])
    seqs = torch.randint(0, model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    hot = torch.tensor([1, 5, 7, 40, 99])
    got = target_distribution(model, seqs, hot)
    with torch.no_grad():
        want = torch.softmax(model(input_ids=seqs).logits.float()[..., hot], dim=-1)
    assert got.shape == (3, 12, 5) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=4e-3, rtol=0)
    sharp = target_distribution(model, seqs, hot, temperature=0.5)
    torch.testing.assert_close(sharp.float(), torch.softmax(2 * model(input_ids=seqs).logits.detach().float()[..., hot], -1),
                               atol=4e-3, rtol=0)



def test_distribution_loss_at_a_one_hot_target_is_the_argmax_loss():
    """With the target's distribution all on its argmax, SpecForge's loss is the cross entropy
    against the argmax; an index whose argmax is not hot is left out of both."""
    from diag.zoo.build_drafters import new_drafter, unroll_loss
    from types import SimpleNamespace
    torch.manual_seed(0)
    cfg = SimpleNamespace(num_attention_heads=2, hidden_size=16, vocab_size=40)
    hot = torch.arange(0, 40, 2)                                          # 20 hot ids: the even ones
    d = new_drafter(SimpleNamespace(config=cfg), dataclasses.replace(TINY_DRAFTER, draft_vocab_size=20), hot, 2)
    embed = torch.nn.Embedding(40, 16)
    B, L, steps = 2, 9, 3
    T = L - steps
    seqs = torch.randint(0, 40, (B, L))
    argmax = torch.randint(0, 20, (B, L)) * 2
    argmax[0, 4] = 3                                                     # not hot: ignored
    batch = views(seqs, torch.randn(B, L, 32), argmax, steps)
    dist = torch.nn.functional.one_hot(torch.where(argmax % 2 == 0, argmax // 2, 0), 20).to(torch.bfloat16)
    torch.testing.assert_close(unroll_loss(d, embed, batch, steps, dist), unroll_loss(d, embed, batch, steps))
    assert batch[3].shape == (B, T, steps)


@pytest.mark.parametrize("native", [True, False])
def test_compute_dtype_puts_the_forward_under_autocast_where_the_cpu_has_bf16(native, monkeypatch):
    from diag.zoo import train
    monkeypatch.setattr(train, "native_bf16", lambda: native)
    b = TrainBudget(steps=1, batch=1, seq_len=1, lr=1e-3)
    with train.compute(dataclasses.replace(b, compute_dtype="bfloat16")):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == (torch.bfloat16 if native else torch.float32)
    with train.compute(b):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with pytest.raises(ValueError, match="compute_dtype 'fp8'"):
        train.compute(dataclasses.replace(b, compute_dtype="fp8"))


def test_ids_rewrite_keeps_weights_and_writes_the_other_convention(tiny_corpus, tiny_targets, tmp_path):
    """The derived entry of the seeds' story: same weights, vLLM's L{id} ids (which read back
    as the trained layout under vLLM's rule), no trained layout in the config."""
    from diag.engines.conventions import resolve
    from diag.zoo.build_derived import build_derived
    deps = {"t": tiny_targets["llama"][0], "c": tiny_corpus}
    build_drafter(TINY_DRAFTER, tmp_path / "src", deps, corpus="c")
    (tmp_path / "out").mkdir()
    meta = build_derived(DerivedDrafterRecipe("src", convention="vllm"), tmp_path / "out", tmp_path / "src",
                         deps["t"], "embed+L1")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert meta["eagle_aux_hidden_state_layer_ids"] == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1]
    assert "diag_trained_layout" not in cfg and cfg["diag_layer_id_convention"] == "vllm"
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (tmp_path / "src" / "model.safetensors").read_bytes()
    assert str(resolve([0, 1], "vllm", 2).layout) == "embed+L1"
    with pytest.raises(DiagError, match="cannot be written in this convention"):
        build_derived(DerivedDrafterRecipe("src", convention="sglang-default"), tmp_path / "out", tmp_path / "src",
                      deps["t"], "embed+L1")


def test_deepseek_is_saved_in_the_real_format(tiny_targets):
    path = tiny_targets["deepseek"][0]
    with safe_open(str(path / "model.safetensors"), "pt") as fh:
        keys = set(fh.keys())
        dtypes = {k: fh.get_tensor(k).dtype for k in keys}
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in keys)
    for e in range(4):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.1.mlp.experts.{e}.{proj}.weight" in keys
    assert "model.layers.0.mlp.gate_proj.weight" in keys                 # first layer dense
    assert dtypes["model.layers.1.mlp.gate.e_score_correction_bias"] == torch.float32
    assert dtypes["model.layers.1.mlp.experts.0.gate_proj.weight"] == torch.bfloat16
    model = load_back(path)                                               # strict: raises on any key issue
    assert type(model).__name__ == "DeepseekV3ForCausalLM"
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["dtype"] == "bfloat16"


def test_expert_balancer_moves_bias_toward_idle_experts():
    torch.manual_seed(0)
    model = new_model(TargetRecipe("c", TINY_SHAPES["deepseek"], TINY_BUDGET, "bfloat16"), 50,
                      {"<|bos|>": 0, "<|eos|>": 1, "<|pad|>": 2})
    bal = ExpertBalancer(model, gamma=0.5)
    model(input_ids=torch.randint(0, 50, (2, 16)))
    load = bal.loads[0].clone()
    assert load.sum() == 2 * 16 * 2                                        # tokens x top-2
    bal.step(0)
    bias = bal.routers[0].e_score_correction_bias
    assert torch.equal(bias, 0.5 * torch.sign(load.mean() - load))


# ---- CLI ---------------------------------------------------------------------------

def test_cli_lists_entries_and_rejects_unknown_names(cache_dir, capsys):
    from diag.cli import zoo as cmd
    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers())
    args = parser.parse_args(["zoo", "list"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ZOO) and "not built" in out
    args = parser.parse_args(["zoo", "build", "llama-huge"])
    assert args.func(args) == 2
    assert "unknown zoo entry" in capsys.readouterr().err


# ---- the real zoo (built on first use, cached after) ----------------------------------

def _zoo_test(fn):
    """Mark `slow` while some zoo entry still has to be built (the first run builds it)."""
    return fn if all(is_built(n) for n in ZOO) else pytest.mark.slow(fn)


@_zoo_test
@pytest.mark.parametrize("name", ["llama-tiny", "deepseek-tiny"])
def test_zoo_targets_load_and_are_trained(name):
    from transformers import AutoTokenizer
    path = zoo_path(name, progress=False)
    model = load_back(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.vocab_size == len(tok) and tok.chat_template
    from diag.checkpoint.config import read_config_json
    from diag.engines.sglang.architectures import capture_model
    assert capture_model(read_config_json(path)) == name.split("-")[0]    # "llama" / "deepseek"
    meta = read_meta(name)["metrics"]
    assert meta["heldout_perplexity"] < meta["unigram_perplexity"] / 3
    if name == "llama-tiny":                         # the calibration target: varied, structured text
        assert meta["heldout_perplexity"] < 90
        assert meta["continuations"]["distinct_texts"] >= 7
        assert meta["continuations"]["mean_distinct_2"] > 0.15


@_zoo_test
@pytest.mark.parametrize("name", [n for n, e in ZOO.items() if isinstance(e.recipe, DrafterRecipe)])
def test_zoo_drafters_declare_layout_and_vocab(name):
    from diag.drafter.checkpoint import load_drafter
    recipe = ZOO[name].recipe
    path = zoo_path(name, progress=False)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["diag_trained_layout"] == recipe.layout
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == specforge_ids(layout(recipe.layout))
    drafter, _ = load_drafter(path)                                      # strict shape/vocab checks
    d2t, t2d = drafter.d2t, drafter.t2d
    t = torch.arange(len(d2t)) + d2t                                     # t = d + d2t[d]
    assert t.tolist() == sorted(set(t.tolist())) and int(t2d.sum()) == len(d2t)
    assert bool(t2d[t].all())
    meta = read_meta(name)["metrics"]
    assert meta["accept_depth1"] > meta["baseline_most_frequent"] + 0.2
    assert meta["greedy_chain"]["accept_length"] > 1.5
    if name == "llama-tiny-eagle3-embed":            # embed vs L1 is the sharp distinction (DESIGN §10)
        shifted = meta["greedy_chain_shifted_layout"]
        assert shifted["layout"] == "L1+L3+L5"
        assert meta["greedy_chain"]["accept_length"] > shifted["accept_length"] + 0.5   # measured 3.23 / 1.28


@_zoo_test
def test_zoo_vllm_ids_drafter_is_served_one_layer_off():
    """The demo's drafter: the embed drafter's weights, ids [0, 2, 4] in vLLM's convention;
    SGLang 0.5.23 reads them as L1+L3+L5 (the seeds' story), and [-1, 1, 3] fixes it."""
    from diag.engines.sglang.serving import serving_ids, serving_plan
    path = zoo_path("llama-tiny-eagle3-embed-vllm-ids", progress=False)
    cfg = json.loads((path / "config.json").read_text())
    tcfg = json.loads((zoo_path("llama-tiny", progress=False) / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    assert str(serving_plan(cfg, tcfg, engine_name="sglang-0.5.23").layout) == "L1+L3+L5"
    assert serving_ids(layout("embed+L2+L4"), tcfg, engine_name="sglang-0.5.23") == [-1, 1, 3]
    src = zoo_path("llama-tiny-eagle3-embed", progress=False)
    assert (path / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


@_zoo_test
def test_zoo_int4_packs_only_routed_experts():
    path = zoo_path("deepseek-tiny-int4", progress=False)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["quantization_config"]["format"] == "pack-quantized"
    packed = []
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            packed += [k for k in fh.keys() if k.endswith("weight_packed")]
    assert packed and all(".mlp.experts." in k for k in packed)
    shape = ZOO["deepseek-tiny"].recipe.shape
    assert len(packed) == 3 * shape.n_routed_experts * (shape.num_hidden_layers - shape.first_k_dense_replace)
