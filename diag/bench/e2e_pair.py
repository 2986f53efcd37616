"""The e2e section's drafter under sampling: the bench pair's trained drafter (bench/pair.py)
trained on the e2e run's own prompts, so the sampled decode loop accepts like a trained pair
(the Kimi-shaped drafter has random weights and accepts ~1.02: every round emits one token).

Which prompts. The run's prompts as the pipeline tokenizes them (run/inputs.prepare: the serving
rendering), each cut to its last m ids, m the shortest prompt's length: the pair's trainer
continues a [P, m] batch (bench/pair.py). On the GPU bench's target (zoo.kimi_shaped's successor
head, margin 26) a greedy continuation follows succ(last id) whatever came before, so the cut
prompts continue as the run's whole prompts do and the drafter learns the ids the run decodes.
On a random-head target (the CPU bench's) the continuation depends on the whole context: the cut
changes it, and the pair accepts ~1 on the run; `made` says which target it was.
Example: 8 prompts of 41..612 ids -> 8 x 41 ids, continued by max_new_tokens + 3.

Which layouts. The e2e run's layouts and the one-more-layout run's new layout, the first of them
written as trained_layout: every variant the runs decode has features the drafter saw in training.
This module knows the e2e case and the pair's trainer; nothing about timing.
"""

from __future__ import annotations

from pathlib import Path


def e2e_prompt_ids(case) -> list[list[int]]:
    """The case's prompts as the run tokenizes them, each cut to the shortest one's length (its
    last ids). Reads the tokenizer and the prompt file; no weight."""
    from diag.run.case import check_case
    from diag.run.inputs import prepare

    ids = [list(p) for _, _, p in prepare(check_case(case)).prompts]
    m = min(len(p) for p in ids)
    return [p[len(p) - m:] for p in ids]


def e2e_pair_drafter(target: Path, case, layouts: list[str], drafter_widths: dict, load_model,
                     recipe=None, cache: Path | None = None) -> tuple[Path, str]:
    """(the trained drafter's directory, how it was made and what it accepts, one line).
    load_model(): the target as the bench loads it (freed when this returns); recipe: PairRecipe."""
    from diag.bench.pair import PairRecipe, trained_pair_drafter

    prompts = e2e_prompt_ids(case)
    model = load_model()
    try:
        path, made = trained_pair_drafter(Path(target), model, prompts, case.prompts.max_new_tokens, layouts,
                                          drafter_widths, recipe=recipe or PairRecipe(), cache=cache)
    finally:
        del model
    note = (f"bench pair drafter (bench/e2e_pair.py): {made['made']}; prompts cut to their last "
            f"{len(prompts[0])} ids; chain-3 accept length on them, worst layout: greedy "
            f"{made['greedy_accept_length_min']:.3f}, T=1.0 top-p 0.95 {made['t1_accept_length_min']:.3f}")
    return path, note


def bench_e2e(ks, layers: int, workdir: Path, *, prompts: int | None, new_tokens: int, evaluate: dict | None,
              device: str, decoding: dict | None = None, drafter_widths: dict | None = None, recipe=None,
              whole_machine: bool = True, pair_cache: Path | None = None, partial=None) -> dict:
    """The bench's e2e section on a kimi_shaped pair `ks` (bench/e2e.end_to_end over the shipped
    prompts, the first `prompts` of them). With a sampled decoding the run is drafted by the pair's
    drafter trained here on its own prompts and layouts (trained before the first run, whose
    page-cache drop and fresh cache keep it a first run); greedy keeps the Kimi-shaped drafter."""
    import gc

    from diag.bench.e2e import e2e_layouts, end_to_end, kimi_case, one_more_layout
    from diag.run.shipped import DEFAULT_PROMPTS, shipped

    cpu = device == "cpu"
    kw = dict(prompts=shipped(DEFAULT_PROMPTS), limit=prompts, max_new_tokens=new_tokens, evaluate=evaluate,
              gpus=0 if cpu else 1, dtype="float32" if cpu else "bfloat16")
    drafter, note = ks.drafter, "kimi-shaped drafter, random weights (accepts ~1.02)"
    if (decoding or {}).get("temperature"):
        lays = e2e_layouts(ks.layout, layers)
        case = kimi_case(ks.target, ks.drafter, lays, **kw)
        drafter, note = e2e_pair_drafter(ks.target, case, [*lays, one_more_layout(lays)], drafter_widths or {},
                                         lambda: _pair_target(ks.target, device), recipe=recipe, cache=pair_cache)
        if partial is not None:
            partial({"drafter": note, "incomplete": "no run finished"})
        gc.collect()
        if not cpu:
            import torch
            torch.cuda.empty_cache()
    return end_to_end(ks.target, drafter, ks.layout, layers, workdir, drafter_note=note, decoding=decoding,
                      whole_machine=whole_machine, partial=partial, **kw)


def _pair_target(target: Path, device: str):
    """The target as the sampled section trains its pair on it: INT4 with fast experts on a GPU
    (bf16), float32 on the CPU."""
    import torch

    from diag.int4.load import load_packed_target

    if device == "cpu":
        return load_packed_target(target, dtype=torch.float32)
    from diag.bench.gpu import load_int4
    from diag.int4.fast import accelerate

    model = load_int4(target, device)
    accelerate(model)
    return model
