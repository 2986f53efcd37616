"""The GPU benchmark: one call on one GPU measures, for a Kimi-shaped INT4 target,
  ceilings       bf16 matmul FLOP/s and copy bandwidth, in the same run
  checkpoint     a 2-layer real-width checkpoint written and loaded (resident vs disk bytes)
  experts        one MoE layer: diag's eager packed loop, the fused INT4 kernel, and
                 transformers' bf16 grouped_mm on the same (dequantized) weights
  pass_2layer    whole capture pass, INT4 (fused) vs bf16 grouped_mm experts, same layers
  grown          the model grown in GPU memory to as many layers as fit (extra layers are
                 copies of layer 1's random weights), capture passes at 8k and 16k tokens,
                 peak memory vs weight bytes, and what diag.target.placement planned for it
  sampled        the sampled decode loop (T 1.0, top-p 0.95) on the 2-layer INT4 target, 3 layouts
                 x 6 tree shapes over 32 prompts: tokens/s, and its cost in teacher-forced passes
                 over the same tokens per (layout, tree) (goal: <= num_draft_tokens), by phase
  drafter        batched replay, 3 layouts x 6 tree shapes, Kimi drafter widths
  naive          the step-by-step loop, seconds per position, and the speed ratio
Every section is recorded even when another fails. `only` (diag bench gpu --only sampled) runs
the named sections (GPU_SECTIONS) after the ceilings and the checkpoint they need, e.g. the
sampled loop alone (drafter reuses grown's pass; naive reads target_pass). This module is the
benchmark's orchestration; the measurements live in target.py, drafter.py and naive.py.
"""

from __future__ import annotations

import copy
import inspect
import time
from pathlib import Path

import torch

from diag.bench import GPU_SECTIONS
from diag.bench.common import copy_bandwidth, envelope, matmul_peak, save
from diag.bench.common import section as run_section
from diag.bench.drafter import replay_bench
from diag.bench.naive import naive_loop
from diag.bench.target import capture_throughput, experts_compare, synthetic_sequences
from diag.int4.packed import resident_bytes
from diag.layouts import layout, union_points

GiB = 2 ** 30


def load_int4(path: Path, device: str):
    """load_packed_target onto one device, whichever placement argument it takes."""
    from diag.int4.load import load_packed_target

    params = inspect.signature(load_packed_target).parameters
    kw = {"device_map": {"": device}} if "device_map" in params else {"device": device}
    return load_packed_target(path, dtype=torch.bfloat16, **kw)


def grow(model, layers: int) -> int:
    """Append copies of the last decoder layer until the model has `layers` layers."""
    stack = model.model.layers
    base = stack[-1]
    while len(stack) < layers:
        new = copy.deepcopy(base)
        new.self_attn.layer_idx = len(stack)
        stack.append(new)
    model.config.num_hidden_layers = len(stack)
    return len(stack)


def layers_that_fit(model, reserve: int, cap: int) -> int:
    free = torch.cuda.mem_get_info()[0]
    per_layer = resident_bytes(model.model.layers[-1])
    return min(cap, len(model.model.layers) + max(0, int((free - reserve) // per_layer)))


def run(out: Path, workdir: Path, *, max_layers: int = 61, tokens=(2048, 8192, 16384, 32768),
        seq_len: int = 512, num_seqs: int = 32, prompt_len: int = 128, only: tuple[str, ...] = ()) -> dict:
    unknown = sorted(set(only) - set(GPU_SECTIONS))
    if unknown:
        raise ValueError(f"unknown bench sections {unknown}: expected some of {list(GPU_SECTIONS)}")
    from diag.int4.fast import accelerate
    from diag.zoo.kimi_shaped import kimi_shaped

    dev = "cuda"
    res = envelope("gpu", {"max_layers": max_layers, "tokens": list(tokens), "seq_len": seq_len,
                           "num_seqs": num_seqs, "prompt_len": prompt_len, "only": list(only)})
    st: dict = {}

    def section(results, name, fn):
        return None if only and name not in only else run_section(results, name, fn)
    ceil = run_section(res, "ceilings", lambda: {"bf16_matmul_flops": matmul_peak(dev),
                                             "copy_bytes_per_s": copy_bandwidth(dev)})
    peak = ceil["bf16_matmul_flops"] if ceil else 7.9e14

    def checkpoint():
        t0 = time.perf_counter()
        ks = kimi_shaped(workdir, layers=2, seed=0, device=dev)
        t1 = time.perf_counter()
        st["model"], st["ks"] = load_int4(ks.target, dev), ks
        st["n_fast"] = accelerate(st["model"])
        res_b = resident_bytes(st["model"])
        return {"write_seconds": t1 - t0, "load_seconds": time.perf_counter() - t1,
                "checkpoint_bytes": ks.bytes_on_disk, "resident_bytes": res_b,
                "resident_over_checkpoint": res_b / ks.bytes_on_disk, "fast_experts": st["n_fast"]}
    if run_section(res, "checkpoint", checkpoint) is None:
        return save(res, out) and res
    model = st["model"]
    moe = model.model.layers[1].mlp
    section(res, "experts", lambda: experts_compare(moe, list(tokens), peak, eager_tokens=8192))
    save(res, out)
    seqs = synthetic_sequences(num_seqs, seq_len, prompt_len, model.config.vocab_size)
    lays = [st["ks"].layout, "L1+L2+final", "embed+L1+final"]
    points = tuple(dict.fromkeys(union_points([layout(x) for x in lays]) + (layout("final").points[0],)))
    section(res, "pass_2layer", lambda: _two_layer(model, moe, seqs, points))
    save(res, out)
    section(res, "sampled", lambda: _sampled(st, model, lays, num_seqs, prompt_len))
    save(res, out)
    section(res, "grown", lambda: _grown(model, seqs, points, max_layers, st))
    save(res, out)
    section(res, "drafter", lambda: _drafter(st, model, lays, peak))
    section(res, "naive", lambda: _naive(st, model, seqs, lays[0], prompt_len, res))
    return save(res, out) and res


def _two_layer(model, moe, seqs, points) -> dict:
    from diag.bench.target import dense_grouped_mm

    int4_row, _ = capture_throughput(model, seqs, points, 16384)
    packed = moe.experts
    moe.experts = dense_grouped_mm(packed, model.config)
    bf16_row, _ = capture_throughput(model, seqs, points, 16384)
    moe.experts = packed
    torch.cuda.empty_cache()
    return {"int4": int4_row, "bf16_grouped_mm": bf16_row,
            "throughput_ratio": int4_row["tokens_per_second"] / bf16_row["tokens_per_second"],
            "weight_memory_ratio": int4_row["weight_bytes"] / bf16_row["weight_bytes"]}


def _grown(model, seqs, points, max_layers, st) -> dict:
    from diag.zoo.kimi_shaped import kimi_config
    from diag.target.placement import activation_bytes, place

    reserve = activation_bytes(model.config, 16384) + 24 * GiB  # + drafter and its beam replay
    n = grow(model, layers_that_fit(model, reserve, max_layers))
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        place(kimi_config(n), 1, available=[total], token_budget=16384)
        planned = "fits"
    except Exception as err:  # the planner's verdict is data here
        planned = f"refused: {err}"
    rows = []
    for budget in (8192, 16384):
        row, st["tp"] = capture_throughput(model, seqs, points, budget)
        rows.append(row)
    weights = resident_bytes(model)
    return {"layers": n, "weight_bytes": weights, "planner_on_this_gpu": planned,
            "activation_estimate_16k": activation_bytes(model.config, 16384), "rows": rows,
            "peak_over_weights": max(r["peak_bytes"] for r in rows) / weights}


def _sampled(st, model, lays, num_prompts, prompt_len, max_new_tokens: int = 64, *, device: str = "cuda",
             dtype=torch.bfloat16, trees=None) -> dict:
    """The sampled section on `model` (on `device`); device/dtype/trees let a CPU test run it."""
    from diag.bench.sampled import TREES, bench_prompts, sampled_bench
    from diag.drafter.checkpoint import load_drafter

    drafter, _ = load_drafter(st["ks"].drafter, dtype=dtype)
    drafter = drafter.to(device)
    prompts = bench_prompts(num_prompts, prompt_len, model.config.vocab_size)
    out = sampled_bench(model, drafter, model.get_input_embeddings(), model.get_output_embeddings(), lays, prompts,
                        max_new_tokens=max_new_tokens, token_budget=16384, trees=trees or TREES)
    out["device"] = str(next(drafter.parameters()).device)
    del drafter
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _drafter(st, model, lays, peak) -> dict:
    from diag.drafter.checkpoint import load_drafter

    drafter, _ = load_drafter(st["ks"].drafter, dtype=torch.bfloat16)
    st["drafter"] = drafter.to("cuda")
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    out = replay_bench(st["drafter"], embed, head, st["tp"], lays, peak, token_budget=2048)
    st["replay"] = out
    return out


def _naive(st, model, seqs, lay, prompt_len, res) -> dict:
    out = naive_loop(model, st["drafter"], model.get_input_embeddings(), seqs[0].ids, lay,
                     prompt_len=prompt_len, positions=8, steps=3)
    grown = res["sections"].get("grown", {})
    rows = grown.get("rows") or []
    if rows and "replay" in st:
        tokens = rows[-1]["tokens"]
        target_per_token = rows[-1]["seconds"] / tokens
        rp = st["replay"]
        drafter_per_round = rp["seconds"] / max(rp["rounds"], 1)
        batched = target_per_token + drafter_per_round
        out.update({"batched_seconds_per_position": batched,
                    "speedup_over_naive": out["seconds_per_position"] / batched})
    return out
