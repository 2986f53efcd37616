"""Hub ids that cannot be resolved (issue 35, "models named as the engines name them"): malformed
ids, an empty revision, an id or a revision the offline cache lacks, a repo without config.json,
a snapshot whose weights were never downloaded, a launch line lint cannot take the pair from.
Each is a clear error naming the flag or case key, before any weight is read. A local directory
spelt like a hub id is used, and the report says so."""

import shutil

import pytest

from bad_catalogue import Bad, Error, Handled
from hub_cache import add_to_cache

SHA = "3" * 40


def _offline(ctx, *repos, **kw):
    """An offline cache in ctx.tmp holding `repos` ((repo_id, "target"|"drafter") pairs)."""
    cache = ctx.tmp / "hf"
    for repo, what in repos:
        add_to_cache(cache, repo, ctx.pair[what], SHA, **kw)
    ctx.env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))
    return cache


def _with(*repos, **kw):
    def build(run):
        def inner(ctx):
            _offline(ctx, *repos, **kw)
            return run(ctx)
        return inner
    return build


def _case_run(ctx, target, drafter):
    body = (f'[prompts]\nfile = "{ctx.pair["prompts"]}"\nmax_new_tokens = 8\n'
            '[evaluate]\nlayouts = ["embed+L2+L3"]\ntrees = ["chain-2"]\n')
    return ["run", ctx.case(body, target=target, drafter=drafter), "--out", ctx.out, "--quiet"]


def _no_config(ctx):
    cache = _offline(ctx, ("org/t", "target"))
    add_to_cache(cache, "org/weights-only", ctx.pair["drafter"], SHA, only={"model.safetensors"})
    return ctx.run(target="org/t", drafter="org/weights-only")


def _local_wins(ctx):
    _offline(ctx)                                     # an empty cache: the hub id could not resolve
    shutil.copytree(ctx.pair["target"], ctx.tmp / "org" / "t")
    return _case_run(ctx, "org/t", ctx.pair["drafter"])


def _local_note(ctx):
    assert any("org/t is the local directory" in n and "instead of the Hugging Face hub id" in n
               for n in ctx.notes()), ctx.notes()
    assert ctx.report()["target"]["path"] == str((ctx.tmp / "org" / "t").resolve())


NO_DRAFT = "python -m sglang.launch_server --model-path org/t --speculative-algorithm EAGLE3"

CATALOGUE = [
    Bad("hub-id-three-parts", lambda c: c.run(target="a/b/c"),
        Error(("not a local directory, and not a hub id", "--target (target.path)", "a/b/c", "org/name@revision"))),
    Bad("hub-id-bad-characters", lambda c: c.run(drafter="org/bad..name"),
        Error(("malformed hub id", "--drafter (drafter.path)", "org/bad..name"))),
    Bad("hub-id-empty-revision-in-case", lambda c: _case_run(c, c.pair["target"], "org/d@"),
        Error(("hub id has an empty revision", "drafter.path", "case.toml", "org/d@"))),
    Bad("hub-id-not-in-offline-cache", _with()(lambda c: c.run(target="org/missing")),
        Error(("hub id is not in the Hugging Face cache", "--target", "org/missing", "models--org--missing",
               "hf download org/missing --revision main"))),
    Bad("hub-revision-not-in-cache", _with(("org/t", "target"))(lambda c: c.run(target="org/t@v9")),
        Error(("hub revision is not in the Hugging Face cache", "--target", "revision v9", "main, 333333333333"))),
    Bad("lint-hub-revision-not-in-cache", _with(("org/t", "target"))(
        lambda c: ["lint", "--target", "org/t@v9", "--drafter", c.pair["drafter"]]),
        Error(("hub revision is not in the Hugging Face cache", "--target", "unset HF_HUB_OFFLINE"))),
    Bad("hub-repo-without-config", _no_config,
        Error(("hub repo has no config.json", "--drafter", "org/weights-only", "model.safetensors"))),
    Bad("hub-snapshot-without-weights", _with(("org/t", "target"), only={"config.json", "tokenizer_config.json"},
                                            tree=True)(lambda c: c.run(target="org/t")),
        Error(("hub snapshot is incomplete", "--target", "model.safetensors", "hf download org/t --revision main"))),
    Bad("lint-no-drafter-named", lambda c: ["lint", "--target", c.pair["target"]],
        Error(("no drafter checkpoint named", "--drafter", "--launch"))),
    Bad("lint-launch-names-no-drafter", lambda c: ["lint", "--target", c.pair["target"], "--launch", NO_DRAFT],
        Error(("no drafter checkpoint named", "--drafter", "draft_model_path"))),
    Bad("lint-launch-not-a-server-and-no-pair", lambda c: ["lint", "--launch", "python serve.py --model-path org/t"],
        Error(("not an SGLang launch command", "--launch"))),
    Bad("hub-id-spelling-of-a-local-directory", _local_wins, Handled(_local_note)),
]


@pytest.mark.parametrize("bad", [b.param() for b in CATALOGUE])
def test_bad_hub_ids(bad, outcome):
    outcome(bad)
