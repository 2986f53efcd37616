"""The CPU benchmark: a small Kimi-shaped pair (real formats, shrunk widths) through the
same measurements as the GPU run where they make sense on a CPU: capture-pass tokens/s
(diag's eager packed loop), batched drafter replay (3 layouts x 6 trees) against the
measured fp32 matmul rate, the naive loop's speed ratio, and the sampled decode loop
(3 layouts x 6 trees over 32 prompts) against the teacher-forced pass on the same tokens, drafted by the
bench pair's trained drafter (bench/pair.py; the section's `drafter` says how it was made and what it
accepts, greedy and at T=1.0; the other sections keep the random one). The numbers describe diag's
overheads at toy widths, not Kimi speed. `sampled` also runs the loop on the zoo's trained demo
pair per tree shape, and the demo beside demo-sampled (bench/sampled_zoo.py).
`load` writes a larger Kimi-shaped target (LOAD_WIDTHS, 3 layers, 1.38 GB) and measures
diag's load into CPU memory against the raw read of the same files, and the first run's
load (the content digest in the same read) beside them (bench/load.py; only these files'
pages are dropped, the shared machine's page cache stays; each cold row best of 5, the
machine being shared and noisy).
`e2e`: `diag run` end to end on the small pair (bench/e2e.py, shared with the GPU bench): the
first run, the cached repeat (checks_s, goal <= 2 s) and the repeat with one more layout
(e2e.one_more_layout, goal <= 5 s in all), at toy widths; with e2e_decoding (e.g. e2e.SAMPLED) the
runs evaluate that decoding too, drafted by the bench pair's drafter trained on the run's prompts
(bench/e2e_pair.py; on this random-head target it accepts ~1: the keys, not the acceptance, are the point).
`zoo`, only when asked: the whole zoo built into an empty cache, the demo's entries first (bench/zoo.py).

This module is orchestration; the measurements live in target.py, drafter.py, naive.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from diag.bench.common import envelope, matmul_peak, save, section
from diag.bench.drafter import replay_bench
from diag.bench.naive import naive_loop
from diag.bench.sampled import bench_prompts, sampled_bench
from diag.bench.target import capture_throughput, synthetic_sequences
from diag.layouts import layout, union_points

SMALL = {"hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
         "n_routed_experts": 16, "num_experts_per_tok": 4, "q_lora_rank": 96, "kv_lora_rank": 64,
         "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 4096}
SMALL_DRAFTER = {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
                 "intermediate_size": 512, "draft_vocab_size": 1024}
LOAD_WIDTHS = {"hidden_size": 2048, "intermediate_size": 8192, "moe_intermediate_size": 512,
               "n_routed_experts": 256, "num_attention_heads": 16, "num_key_value_heads": 16,
               "vocab_size": 32768}     # 256 * 3 * 512 * 2048 * (1/2 + 2/32) = 453 MB per MoE layer
CPU_E2E_PAIR_STEPS = 20   # the sampled e2e's pair on this random-head target accepts ~1 however long it trains
SECTIONS = ("target", "drafter", "naive", "sampled", "load", "e2e")   # and "zoo" when asked (bench/zoo.py: ~5 min)


def run(out: Path, workdir: Path, *, layers: int = 4, num_seqs: int = 8, seq_len: int = 128,
        prompt_len: int = 32, sections=SECTIONS, sampled_prompts: int = 32, sampled_new_tokens: int = 16,
        sampled_trees=None, e2e_prompts: int = 8, e2e_new_tokens: int = 32,
        e2e_decoding: dict | None = None) -> dict:
    from diag.drafter.checkpoint import load_drafter
    from diag.int4.load import load_packed_target
    from diag.zoo.kimi_shaped import kimi_shaped

    res = envelope("cpu", {"layers": layers, "widths": SMALL, "num_seqs": num_seqs, "seq_len": seq_len,
                           "sections": list(sections), "e2e_decoding": e2e_decoding})
    ceil = section(res, "ceilings", lambda: {"fp32_matmul_flops": matmul_peak("cpu", 1024, 5, torch.float32)})
    peak = ceil["fp32_matmul_flops"] if ceil else 1e11
    if "load" in sections:
        section(res, "load", lambda: _load(workdir / "load"))
        save(res, out)
    if "zoo" in sections:
        from diag.bench.zoo import zoo_build_bench
        section(res, "zoo", lambda: zoo_build_bench(workdir / "zoo"))
        save(res, out)
    if "sampled" in sections:                       # the trained zoo pair, and demo beside demo-sampled
        from diag.bench.sampled_zoo import zoo_sampled_bench
        section(res, "sampled_trained", zoo_sampled_bench)
        save(res, out)
    if not set(sections) & {"target", "drafter", "naive", "sampled", "e2e"}:
        return save(res, out) and res
    ks = kimi_shaped(workdir, layers=layers, widths=SMALL, drafter_widths=SMALL_DRAFTER)
    if "e2e" in sections:
        section(res, "e2e", lambda: _e2e(ks, layers, workdir / "e2e", e2e_prompts, e2e_new_tokens,
                                                 e2e_decoding))
        save(res, out)
    if not set(sections) & {"target", "drafter", "naive", "sampled"}:
        return save(res, out) and res
    model = load_packed_target(ks.target, dtype=torch.float32)
    drafter, _ = load_drafter(ks.drafter)
    seqs = synthetic_sequences(num_seqs, seq_len, prompt_len, SMALL["vocab_size"])
    lays = [ks.layout, f"L1+L{layers}+final", "embed+L1+final"]
    points = tuple(dict.fromkeys(union_points([layout(x) for x in lays]) + (layout("final").points[0],)))
    st = {}

    def target():
        row, st["tp"] = capture_throughput(model, seqs, points, 4096)
        return row
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    rp = {}                                                         # the drafter section's row

    def naive():
        out = naive_loop(model, drafter, embed, seqs[0].ids, lays[0], prompt_len=prompt_len, positions=8)
        tgt = res["sections"]["target_pass"]
        batched = tgt["seconds"] / tgt["tokens"] + rp["seconds"] / max(rp["rounds"], 1)
        out.update({"batched_seconds_per_position": batched,
                    "speedup_over_naive": out["seconds_per_position"] / batched})
        return out
    if set(sections) & {"target", "drafter", "naive"}:      # naive needs the other two
        section(res, "target_pass", target)
        rp = section(res, "drafter", lambda: replay_bench(drafter, embed, head, st["tp"], lays, peak,
                                                          token_budget=1024))
        section(res, "naive", naive)
    if "sampled" in sections:
        prompts = bench_prompts(sampled_prompts, prompt_len, SMALL["vocab_size"])
        trees = {"trees": tuple(sampled_trees)} if sampled_trees else {}
        section(res, "sampled", lambda: _sampled(ks, model, embed, head, lays, prompts, sampled_new_tokens, trees))
    return save(res, out) and res


def _sampled(ks, model, embed, head, lays, prompts, new_tokens: int, trees: dict) -> dict:
    """The loop with the bench pair's trained drafter (bench/pair.py: trained on these prompts'
    greedy continuations, cached); `drafter` says how it was made and what it accepts."""
    from diag.bench.pair import trained_pair_drafter
    from diag.drafter.checkpoint import load_drafter

    path, made = trained_pair_drafter(ks.target, model, prompts, new_tokens, lays, {**SMALL, **SMALL_DRAFTER})
    drafter, _ = load_drafter(path)
    out = sampled_bench(model, drafter, embed, head, lays, prompts, max_new_tokens=new_tokens,
                        token_budget=4096, **trees)
    return {**out, "drafter": made}


def _e2e(ks, layers: int, workdir: Path, prompts: int, new_tokens: int, decoding: dict | None) -> dict:
    from diag.bench.e2e_pair import bench_e2e

    workdir.mkdir(parents=True, exist_ok=True)
    from diag.bench.pair import PairRecipe

    return bench_e2e(ks, layers, workdir, prompts=prompts, new_tokens=new_tokens, evaluate=None, device="cpu",
                     decoding=decoding, drafter_widths={**SMALL, **SMALL_DRAFTER}, whole_machine=False,
                     recipe=PairRecipe(steps=CPU_E2E_PAIR_STEPS))


def _load(workdir: Path) -> dict:
    import time

    from diag.bench.load import load_bench
    from diag.zoo.kimi_shaped import kimi_shaped

    t0 = time.perf_counter()
    ks = kimi_shaped(workdir, layers=3, widths=LOAD_WIDTHS, drafter=False)
    write = time.perf_counter() - t0
    return {"widths": LOAD_WIDTHS, "layers": 3, "write_seconds": write,
            **load_bench(ks.target, "cpu", warm_threads=(2, 4), whole_machine=False, repeats=5)}
