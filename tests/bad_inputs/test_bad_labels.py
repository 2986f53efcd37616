"""Broken inputs that used to get an OK, or whose blame went to the wrong file (issue 35.2, 35.4):
a header dtype that disagrees with the checkpoint, two weight sets in one directory, a tokenizer
that covers little of the vocabulary, a target config that disagrees with its weights, a drafter
given as the target. Each entry states its outcome."""

import json
import struct

import pytest
import torch

from bad_catalogue import Bad, Error, Handled

EMBED = "model.embed_tokens.weight"
UP1 = "model.layers.1.mlp.up_proj.weight"


def relabel(file, name, dtype):
    """Rewrite one tensor's header dtype in place (same byte size: BF16 <-> F16), bytes untouched."""
    raw = file.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header[name]["dtype"] = dtype
    new = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(new) == n
    file.write_bytes(raw[:8] + new + raw[8 + n:])


def bf16_target(ctx):
    """The tiny target as a BF16 checkpoint (config dtype bfloat16, every tensor BF16)."""
    return ctx.target(config=lambda c: c.update(dtype="bfloat16"),
                      tensors=lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items()}))


def _target_mislabel(name):
    def build(ctx):
        t = bf16_target(ctx)
        relabel(t / "model.safetensors", name, "F16")
        return ctx.run(target=t)
    return build


def _validate_mislabel(ctx):
    """`diag validate` makes every check `diag run` makes before loading (it used to say OK)."""
    t = bf16_target(ctx)
    relabel(t / "model.safetensors", UP1, "F16")
    return ["validate", ctx.case(f'[prompts]\nfile = "{ctx.pair["prompts"]}"\nmax_new_tokens = 8\n'
                                 '[evaluate]\nlayouts = ["embed+L2+L3"]\ntrees = ["chain-2"]\n', target=t)]


def _drafter_mislabel(ctx):
    d = ctx.copy("drafter")
    relabel(d / "model.safetensors", "midlayer.mlp.up_proj.weight", "F16")
    return ctx.run(drafter=d)


def _stale_single_file(ctx):
    """A sharded checkpoint (index + two shards) with a stale model.safetensors beside it."""
    from safetensors.torch import load_file, save_file
    t = ctx.copy("target")
    tensors = load_file(str(t / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(t / shard), metadata={"format": "pt"})
    (t / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}))
    return t


def _two_indexes(ctx):
    t = _stale_single_file(ctx)
    (t / "model.safetensors").unlink()
    (t / "pytorch_model.bin.index.json").write_text("{}")
    idx = json.loads((t / "model.safetensors.index.json").read_text())
    (t / "model.fp32.safetensors.index.json").write_text(json.dumps(idx))
    return t


def _grown_vocab(ctx, vocab):
    """The pair with vocab_size grown from 300 to `vocab` (rows of zeros), its tokenizer (300 ids) unchanged:
    2048 is a tokenizer of another model; 320 is a padded vocabulary (Qwen2.5: 151,665 ids for 152,064)."""
    t = ctx.target(config=lambda c: c.update(vocab_size=vocab), tensors=lambda t: t.update(
        {k: torch.cat([t[k], torch.zeros(vocab - 300, t[k].shape[1])]) for k in (EMBED, "lm_head.weight")}))
    d = ctx.drafter(config=lambda c: c.update(vocab_size=vocab), tensors=lambda t: t.update(
        {"t2d": torch.cat([t["t2d"], torch.zeros(vocab - 300, dtype=torch.bool)])}))
    return ctx.run(target=t, drafter=d)


def _report_written(ctx):
    assert ctx.report()["evaluations"], "no evaluation in the report"


CATALOGUE = [
    Bad("target-header-one-tensor-f16-among-bf16", _target_mislabel(UP1),
        Error(("header dtype disagrees", UP1, "F16", "BF16", "model.safetensors"))),
    Bad("validate-target-header-one-tensor-f16", _validate_mislabel, Error(("header dtype disagrees", UP1))),
    Bad("target-header-embed-tokens-f16", _target_mislabel(EMBED),
        Error(("header dtype disagrees", EMBED, "F16", "target"))),
    Bad("drafter-header-one-tensor-f16-among-bf16", _drafter_mislabel,
        Error(("header dtype disagrees", "midlayer.mlp.up_proj.weight", "F16", "BF16", "drafter"))),
    Bad("target-index-and-stale-single-file", lambda c: c.run(target=_stale_single_file(c)),
        Error(("two weight sets", "model.safetensors.index.json", "model.safetensors"))),
    Bad("target-two-indexes", lambda c: c.run(target=_two_indexes(c)),
        Error(("two weight sets", "model.safetensors.index.json", "model.fp32.safetensors.index.json"))),
    Bad("target-tokenizer-covers-little-of-vocab", lambda c: _grown_vocab(c, 2048),
        Error(("tokenizer covers", "300 ids", "2048", "tokenizer.json"))),
    Bad("target-padded-vocab-passes", lambda c: _grown_vocab(c, 320),   # 300 of 320 ids = 94%
        Handled(_report_written)),
    Bad("target-config-hidden-size-disagrees-with-weights",
        lambda c: c.run(target=c.target(config=lambda x: x.update(hidden_size=64))),
        Error(("target", "config.json", "hidden_size", "64", "32", EMBED))),
    Bad("drafter-given-as-target", lambda c: c.run(target=c.pair["drafter"]),
        Error(("drafter checkpoint", "--target", "LlamaForCausalLMEagle3"))),
    Bad("lint-drafter-given-as-target", lambda c: ["lint", "--target", c.pair["drafter"], "--drafter", c.pair["drafter"]],
        Error(("drafter checkpoint", "--target", "LlamaForCausalLMEagle3"))),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_labels(bad, outcome):
    outcome(bad)


# ---- drafter configs the server cannot run, trees that verify fewer tokens than they draft ----

def _grid_left_out(ctx):
    trees = {e["tree"] for e in ctx.report()["evaluations"]}
    assert trees == {"s1-k2-d3"}, trees
    assert any("s3-k2-d3 left out" in n and "never verified" in n for n in ctx.notes()), ctx.notes()


def _lint_wasted(ctx):
    got = [f for f in json.loads(ctx.stdout) if f["code"] == "TREE_WASTED_STEPS"]
    assert got and got[0]["severity"] == "warning" and "s5-k2-d3" in got[0]["message"], ctx.stdout


def _drafter_cfg(**kv):
    return lambda c: c.run(drafter=c.drafter(config=lambda x: x.update(kv)))


SERVER_CANNOT = [
    Bad("drafter-heads-do-not-divide-hidden", _drafter_cfg(num_attention_heads=5, head_dim=None),
        Error(("rejects the drafter config", "config.json"))),
    Bad("drafter-kv-heads-do-not-divide-heads", _drafter_cfg(num_attention_heads=4, num_key_value_heads=3),
        Error(("cannot run this drafter", "num_key_value_heads", "3"))),
    Bad("tree-verifies-fewer-than-it-drafts", lambda c: c.run("--tree", "s5-k2-d3"),
        Error(("verifies fewer tokens than it drafts", "--tree", "s5-k2-d3", "3 of 5 draft steps wasted"))),
    Bad("tree-grid-point-verifies-fewer", lambda c: ["run", c.case(
        f'[prompts]\nfile = "{c.pair["prompts"]}"\nmax_new_tokens = 8\n[evaluate]\nlayouts = ["embed+L2+L3"]\n'
        'trees = []\ntree_grid = {num_steps = [1, 3], topk = [2], num_draft_tokens = [3]}\n'), "--out", c.out, "--quiet"],
        Handled(lambda ctx: _grid_left_out(ctx))),
    Bad("lint-launch-tree-wastes-steps", lambda c: ["lint", "--drafter", c.pair["drafter"], "--target", c.pair["target"],
                                                   "--launch", "python -m sglang.launch_server --model-path T "
                                                   "--speculative-draft-model-path D --speculative-algorithm EAGLE3 "
                                                   "--speculative-num-steps 5 --speculative-eagle-topk 2 "
                                                   "--speculative-num-draft-tokens 3 --max-running-requests 8",
                                                   "--json"],
        Handled(lambda ctx: _lint_wasted(ctx), code=1)),
    Bad("drafter-unknown-rope-type", _drafter_cfg(rope_scaling={"rope_type": "weird", "factor": 2.0}),
        Error(("unknown rope scaling type", "weird"))),
]


@pytest.mark.parametrize("bad", [b.param() for b in SERVER_CANNOT])
def test_bad_server_cannot_run(bad, outcome):
    outcome(bad)
