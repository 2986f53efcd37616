"""A prompt set cut into one contiguous shard per rank, and the target passes of the shards put
back together in the original prompt order, as one process would have computed them.

The cut is the prompt: a prompt's continuation and captured states depend on that prompt alone
(the sampled loop's coins are keyed on the prompt's index in the whole set, never on a shard),
so concatenating the shards' passes in rank order gives the single-process pass, and
everything after it (replay, bootstrap intervals, verdicts) runs unchanged on rank 0.

Worked example: 5 prompts over 2 ranks -> rank 0 prompts [0, 1, 2], rank 1 [3, 4]; the
long-context ladder of 3 prompts over 4 ranks is shorter than the world, so rank 0 passes it
whole and ranks 1-3 leave it out.

This module knows Inputs and TargetPass; nothing about processes, stores or sockets (ranks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from diag.errors import DiagError
from diag.run.inputs import Inputs, dtype_of
from diag.run.target_passes import extra_prompt_sets, pass_key, special_ids
from diag.target.pass_cache import save_pass, token_digest
from diag.target.passes import TargetPass


@dataclass(frozen=True)
class World:
    rank: int
    size: int

    def shard(self, n: int) -> range:
        """This rank's contiguous slice of n items, the first n % size ranks one longer.
        Example: n 5, size 2 -> rank 0 range(0, 3), rank 1 range(3, 5)."""
        base, extra = divmod(n, self.size)
        lo = self.rank * base + min(self.rank, extra)
        return range(lo, lo + base + (1 if self.rank < extra else 0))

    def extra_shard(self, n: int) -> range:
        """A prompt set replayed besides the main one: sharded like it when every rank gets at
        least one prompt, else passed whole by rank 0 (3 prompts over 4 ranks -> rank 0 all)."""
        if n >= self.size:
            return self.shard(n)
        return range(n) if self.rank == 0 else range(0)


def check_world(inp: Inputs, world: World, flag: str) -> None:
    """Every rank needs at least one prompt: more ranks than prompts is the user's mistake."""
    n = len(inp.prompts)
    if world.size > n:
        raise DiagError("more ranks than prompts: every rank needs at least one prompt", file=inp.case.source,
                        field=flag, expected=f"at most {n} (the case's prompt count after [prompts] limit/filters)",
                        found=world.size, hint=f"run with {flag.split()[0]} {n} or fewer, or add prompts")


def shard_inputs(inp: Inputs, world: World) -> Inputs:
    """The Inputs a rank passes the target over: its slice of the serving rendering's prompts,
    of every other rendering's and of the long-context ladder; a set it has no prompt of is
    left out (its `others()` and `long_prompts` no longer name it)."""
    mine = [inp.prompts[i] for i in world.shard(len(inp.prompts))]
    rendered = inp.rendered
    if rendered is not None:
        ids = {name: [rows[i] for i in (world.shard(len(rows)) if name == rendered.serving
                                        else world.extra_shard(len(rows)))]
               for name, rows in rendered.ids.items()}
        names = tuple(n for n in rendered.names if n == rendered.serving or ids[n])
        rendered = replace(rendered, names=names, ids={n: ids[n] for n in names})
    longs = inp.long_prompts
    if longs:
        longs = [longs[i] for i in world.extra_shard(len(longs))] or None
    return replace(inp, prompts=mine, rendered=rendered, long_prompts=longs)


def _concat(regime: str, parts: list[TargetPass]) -> TargetPass:
    """Shards' passes in rank order -> one pass; cached when every shard came from the cache."""
    states = {name: [t for p in parts for t in p.states[name]] for name in parts[0].states}
    return TargetPass(regime, [s for p in parts for s in p.sequences], states,
                      [a for p in parts for a in p.argmax], cached=all(p.cached for p in parts))


def _full_key(inp: Inputs, regime: str, prompts, recorded) -> object:
    eos, pad = special_ids(inp.tokenizer, inp.target_path)
    return pass_key(inp, regime, token_digest(prompts, recorded, eos, pad),
                    dtype_of(inp.case.target.dtype, "target.dtype", inp.case))


def _info(inp: Inputs, tp: TargetPass, infos: list[dict], key, use_cache: bool) -> dict:
    """A pass's entry in the report's target_pass section, as one process writes it: the key of
    the whole set (rank 0 saves the merged pass under it, so a later run of either kind finds
    it), cached when every shard was, the slowest shard's seconds."""
    if use_cache and not tp.cached:
        save_pass(key, tp)
    return {"cached": tp.cached, "cache_key": key.digest if use_cache else None,
            "seconds": max(i["seconds"] for i in infos)}


def merge_passes(inp: Inputs, parts: list[tuple[dict, dict, dict]], use_cache: bool
                 ) -> tuple[dict[str, TargetPass], dict, dict[str, TargetPass]]:
    """[(passes, meta, extra) of each rank, in rank order] -> what target_passes returns for the
    whole prompt set (the full Inputs `inp`): per-prompt lists concatenated, the section's
    counts summed, the phases' seconds the slowest rank's, the notes of every rank once."""
    metas = [m for _, m, _ in parts]
    passes = {reg: _concat(reg, [p[reg] for p, _, _ in parts]) for reg in inp.regimes}
    meta = {"regimes": {}, "cache_notes": list(dict.fromkeys(n for m in metas for n in m["cache_notes"])),
            "extra_passes": {}, "phases": {}}
    for m in metas:
        for k, v in m["phases"].items():
            meta["phases"][k] = max(meta["phases"].get(k, v), v)
    for reg, tp in passes.items():
        key = _full_key(inp, reg, inp.prompts, inp.recorded) if use_cache else None
        meta["regimes"][reg] = {**_info(inp, tp, [m["regimes"][reg] for m in metas], key, use_cache),
                                "argmax_agreement": tp.agreement_with_sequence()}
    extra = {}
    for name, prompts in extra_prompt_sets(inp).items():
        holders = [i for i, (_, m, _) in enumerate(parts) if name in m["extra_passes"]]
        extra[name] = _concat(inp.regimes[0], [parts[i][2][name] for i in holders])
        key = _full_key(inp, inp.regimes[0], prompts, None) if use_cache else None
        meta["extra_passes"][name] = {**_info(inp, extra[name], [metas[i]["extra_passes"][name] for i in holders],
                                              key, use_cache), "sequences": len(extra[name].sequences)}
    seqs = passes[inp.regimes[0]].sequences
    meta.update({k: v for k, v in metas[0].items() if k not in meta})
    meta.update({"sequences": len(seqs), "tokens": int(sum(len(s.ids) for s in seqs)),
                 "continuation_tokens": int(sum(s.emitted - s.prompt_len for s in seqs))})
    return passes, _ordered(meta, metas[0]), extra


def _ordered(meta: dict, like: dict) -> dict:
    """The section's keys in the order one process writes them (report.json is compared byte
    for byte)."""
    return {k: meta[k] for k in like} | {k: v for k, v in meta.items() if k not in like}
