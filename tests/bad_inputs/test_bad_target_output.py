"""Garbage continuations are the target's fault (issue 35.2): a recording stuck on one token, a
target whose weights were damaged on disk. The verdict must say the target is at fault, never
"drafter predicts nothing ... look at how the drafter was exported". Each entry states its outcome."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from bad_catalogue import Bad, Handled

ZOO: dict = {}            # the shared zoo's paths, resolved before an entry points DIAG_CACHE_DIR elsewhere
ZOO_ARGS = ("--max-new-tokens", "24", "--limit", "6", "--layout", "embed+L2+L4", "--tree", "chain-3", "--quiet")


def _one_token(ctx):
    rows = [{"id": f"p{i}", "token_ids": [17] * 8} for i in range(3)] + [{"id": "chat", "token_ids": [17] * 8}]
    return ctx.run("--recorded", ctx.lines("rec.jsonl", rows))


def _damaged_zoo_target(damage):
    """The zoo's trained llama-tiny (copied, never the shared entry) damaged on disk, with its
    intact EAGLE-3 drafter."""
    def build(ctx):
        t = shutil.copytree(ZOO["target"], ctx.tmp / "t")
        tensors = load_file(str(t / "model.safetensors"))
        damage(tensors)
        save_file(tensors, str(t / "model.safetensors"), metadata={"format": "pt"})
        return ["run", "--target", t, "--drafter", ZOO["drafter"], "--prompts",
                "cases/prompts/mixed-48.jsonl", "--out", ctx.out, *ZOO_ARGS]
    return build


def _permute_embedding(t):
    key = "model.embed_tokens.weight"
    t[key] = t[key][torch.randperm(t[key].shape[0], generator=torch.Generator().manual_seed(0))]


def _random_decoder(t):
    g = torch.Generator().manual_seed(0)
    for k in [k for k in t if ".layers." in k and k.endswith("proj.weight")]:
        t[k] = torch.randn(t[k].shape, generator=g) * t[k].std()


def blames_target(*signals):
    def check(ctx):
        verdicts = {v["kind"]: v for v in ctx.report()["verdicts"]}
        v = verdicts.get("target-output-garbage")
        assert v is not None and v["severity"] == "error", list(verdicts)
        assert "The fault is the target's" in v["text"] and "drafter-predicts-nothing" not in verdicts
        assert not {"layout-match", "layout-mismatch", "trained-layout"} & set(verdicts)
        for s in signals:
            assert s in v["text"], v["text"]
        assert "look at how the drafter was exported" not in " ".join(x["text"] for x in verdicts.values())
    return check


CATALOGUE = [
    Bad("recorded-continuations-one-token", _one_token, Handled(blames_target("one token (id 17) makes 100%"))),
    Bad("target-embedding-rows-permuted", _damaged_zoo_target(_permute_embedding),
        Handled(blames_target("no better than a uniform guess"))),
    Bad("target-decoder-weights-random", _damaged_zoo_target(_random_decoder),
        Handled(blames_target("no better than a uniform guess"))),
]


@pytest.fixture(scope="module", autouse=True)
def _zoo_paths():
    from diag.zoo import zoo_path
    ZOO.update(target=zoo_path("llama-tiny", progress=False), drafter=zoo_path("llama-tiny-eagle3-embed", progress=False))


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_target_output(bad, outcome):
    outcome(bad)
