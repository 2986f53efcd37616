"""The GPU benchmark: one call on one GPU measures, for a K-layer Kimi-shaped INT4 target
written to disk first (K: --layers, else as many as the free disk holds),
  ceilings       bf16 matmul FLOP/s and copy bandwidth, in the same run
  load           raw read of the shards vs diag's load, cold and warm (bench/load.py)
  e2e            one `diag run` end to end on that target, first run and cached (bench/e2e.py);
                 with a sampled decoding (e2e_decoding, e.g. e2e.SAMPLED) drafted by the bench
                 pair's drafter trained on the run's prompts (bench/e2e_pair.py)
  experts        one MoE layer: diag's eager packed loop, the fused INT4 kernel (tiles tuned
                 first, bench/tiles.py), transformers' bf16 grouped_mm on the same weights
  pass_2layer    whole capture pass, INT4 (fused) vs bf16 grouped_mm experts of layer 1
  grown          the model grown in GPU memory to as many layers as fit (extra layers are
                 copies of the last one), capture passes and a generation probe before and
                 after: the per-layer slopes the 61-layer extrapolation uses (with the sampled
                 decode loop's per round and per verified token, bench/round_slope.py)
  sampled        the sampled decode loop (T 1.0, top-p 0.95), 3 layouts x 6 tree shapes over 32
                 prompts, drafted by the bench pair's trained drafter (bench/pair.py): tokens/s,
                 its cost in teacher-forced passes over the same tokens (goal: <= num_draft_tokens),
                 by phase; the verify forward's bytes per second against the copy bandwidth (goal
                 >= 0.5), and a profile of one tree's rounds (device busy vs wall, top ops)
  drafter        batched replay, 3 layouts x 6 tree shapes, Kimi drafter widths
  naive          the step-by-step loop as before and as a competent user writes it, profiled
`sections` picks which run (ceilings and the checkpoint always do). Every section is
recorded even when another fails. This module is the benchmark's orchestration; the
measurements live in the modules named above and target.py, drafter.py, naive.py.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from diag.bench.common import copy_bandwidth, envelope, matmul_peak, save, section, timed
from diag.bench.drafter import replay_bench
from diag.bench.naive import naive_loop
from diag.bench.target import capture_throughput, experts_compare, synthetic_sequences
from diag.int4.packed import resident_bytes
from diag.layouts import layout, union_points

GiB = 2 ** 30
# The target's head is zoo.kimi_shaped's successor head: greedy continuations that bf16 rounding
# does not flip and a peaked T = 1 distribution, so the bench pair can accept (a random head's
# argmax is a near tie everywhere: the pair trained on its continuations accepted 1.25 greedy).
SUCCESSOR_MARGIN = 26.0


def load_int4(path: Path, device: str):
    """load_packed_target onto one device."""
    from diag.int4.load import load_packed_target

    return load_packed_target(path, dtype=torch.bfloat16, device=device)


def grow(model, layers: int) -> int:
    """Append copies of the last decoder layer until the model has `layers` layers, each copy
    silenced (`silence`): it reads every weight and runs every kernel the last layer does, its
    experts routed alike, and adds nothing to the residual stream, so the grown model decodes
    what the base model decodes. The grown section times layers; the acceptance and the T=1
    distribution are the run's own (the extrapolation takes its rounds and tokens from the e2e
    run). Copies that added to the residual flattened the bench target's T=1 distribution: at 4
    layers every chain-1 round's top-p pivot lay past the accept graph's window, every round ran
    twice (`accept_pivots_deeper`), and the probe's per-layer round came out at 13.4 ms, the
    layer's own kernels ~2 (H100, reports/bench/NOTES.md, twenty-fifth stop)."""
    stack = model.model.layers
    base = stack[-1]
    while len(stack) < layers:
        new = copy.deepcopy(base)
        new.self_attn.layer_idx = len(stack)
        silence(new)
        stack.append(new)
    model.config.num_hidden_layers = len(stack)
    return len(stack)


@torch.no_grad()
def silence(layer) -> None:
    """Zero what a decoder layer adds to the residual stream, in place: its attention's output
    projection and its MLP's down projections (a dense MLP's, the shared experts', the routed
    experts': their INT4 scales, or their dense weights). The layer still reads and multiplies
    every weight (zeros cost a GEMM what any values do), its routing unchanged. A layer with no
    attention output or no MLP output it knows is an error, never a layer left half silent."""
    out = getattr(getattr(layer, "self_attn", None), "o_proj", None)
    if out is None:
        raise ValueError(f"silence: no self_attn.o_proj on {type(layer).__name__}")
    out.weight.zero_()
    mlp = layer.mlp
    found = False
    for proj in (getattr(mlp, "down_proj", None), getattr(getattr(mlp, "shared_experts", None), "down_proj", None)):
        if isinstance(proj, torch.nn.Linear):
            proj.weight.zero_()
            found = True
    experts = getattr(mlp, "experts", None)
    if experts is not None:
        buf = getattr(experts, "down_proj_scale", None)
        buf = getattr(experts, "down_proj", None) if buf is None else buf
        if not isinstance(buf, torch.Tensor):
            raise ValueError(f"silence: no down_proj_scale or down_proj tensor on {type(experts).__name__}")
        buf.zero_()
        found = True
    if not found:
        raise ValueError(f"silence: no MLP output projection on {type(mlp).__name__}")


def layers_that_fit(model, reserve: int, cap: int) -> int:
    if not torch.cuda.is_available():
        return min(cap, len(model.model.layers) + 2)        # a CPU smoke run: two more
    torch.cuda.empty_cache()          # the probes' freed caches and graph pools count as free: they are
    free = torch.cuda.mem_get_info()[0]
    per_layer = resident_bytes(model.model.layers[-1])
    return min(cap, len(model.model.layers) + max(0, int((free - reserve) // per_layer)))


SECTIONS = ("load", "e2e", "experts", "pass", "sampled", "grown", "drafter", "naive", "accept")


def layers_for_disk(workdir: Path, cap: int = 6, margin: int = 8 * GiB) -> int:
    """The most Kimi-shaped layers whose checkpoint (`_layers_in`) fits the free disk under `margin`.
    64 GiB disk with ~60 GiB free -> 4 (5 would leave under 8 GiB)."""
    import shutil
    return _layers_in(shutil.disk_usage(workdir).free - margin, cap)


def _layers_in(room: float, cap: int) -> int:
    """The most Kimi-shaped layers (at least 2, at most cap) whose bytes fit `room`: ~0.8 GB dense
    layer 0 + 4.7 GB embeddings and head, then 9.9 GB per MoE layer."""
    return max(2, min(cap, int((room - 5.5e9) // 9.9e9) + 1))


def layers_for_memory(device_bytes: int, reserve: int, cap: int = 6) -> int:
    """The most Kimi-shaped layers whose resident target (`_layers_in`)
    leaves `reserve` bytes of the device: what the sampled section trains beside it
    (bench/pair.training_bytes, 30.0 GB). H100 (85.0e9 B): (85.0 - 30.0 - 5.5) / 9.9 -> 4 MoE layers
    + layer 0 = 5; H200 (150e9 B): 6 (the cap)."""
    return _layers_in(device_bytes - reserve, cap)


def pair_fits(free: int, need: int, layers: int, per_layer: int) -> str | None:
    """None where the pair's training (`need` bytes) fits the device's `free` bytes beside the
    loaded `layers`-layer target; else why, with the --layers that would leave room (each layer
    fewer frees `per_layer`). Example: 24.6 GB free, 30.0 GB needed, 6 layers of 9.9 GB -> "... run
    with --layers 5 or fewer"."""
    if free >= need:
        return None
    fewer = -(-(need - free) // max(1, per_layer))
    return (f"the sampled section trains the bench pair's drafter beside the {layers}-layer target: "
            f"{need / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free on the device; run with "
            f"--layers {max(2, layers - fewer)} or fewer")


def run(out: Path, workdir: Path, *, layers: int | None = None, max_layers: int = 61,
        tokens=(2048, 8192, 16384, 32768), seq_len: int = 512, num_seqs: int = 32, prompt_len: int = 128,
        sections=SECTIONS, e2e_prompts: int | None = None, e2e_new_tokens: int = 512,
        e2e_evaluate: dict | None = None, e2e_decoding: dict | None = None, tile_budget_s: float = 120.0,
        device: str = "cuda", routing: str = "auto", sampled_trees: tuple[str, ...] | None = None,
        widths: dict | None = None, drafter_widths: dict | None = None) -> dict:
    """device/widths: "cpu" and shrunk widths run the same code paths as a smoke test. routing:
    "auto" (the routing kernel where the routing section measured it faster) or "torch" (the
    torch ops everywhere: an A/B's other arm on the same machine; bench/routing_ab.py).
    sampled_trees: the sampled section's tree shapes (None: all of bench/sampled.TREES)."""
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown bench sections {unknown}: expected some of {list(SECTIONS)}")
    from diag.int4.fast import accelerate
    from diag.zoo.kimi_shaped import kimi_shaped

    dev = device
    workdir.mkdir(parents=True, exist_ok=True)
    if not layers:
        layers = layers_for_disk(workdir)
        if "sampled" in sections and dev == "cuda" and torch.cuda.is_available():
            from diag.bench.pair import training_bytes
            pair_widths = {**(widths or {}), **(drafter_widths or {})}       # st["drafter_widths"], below
            layers = min(layers, layers_for_memory(torch.cuda.mem_get_info()[1], training_bytes(pair_widths)))
    res = envelope("gpu", {"layers": layers, "max_layers": max_layers, "tokens": list(tokens),
                           "seq_len": seq_len, "num_seqs": num_seqs, "prompt_len": prompt_len,
                           "sections": list(sections), "e2e_prompts": e2e_prompts,
                           "e2e_new_tokens": e2e_new_tokens, "e2e_evaluate": e2e_evaluate,
                           "e2e_decoding": e2e_decoding, "routing": routing})
    st: dict = {}

    def keeper(name: str):
        """A section's partial results saved as they are measured; the finished section replaces them."""
        def keep(so_far: dict) -> None:
            res["sections"][name] = so_far
            save(res, out)
        return keep
    ceil = section(res, "ceilings", lambda: _ceilings(dev))
    if "accept" in sections:             # synthetic logits: no checkpoint, so first, and alone where asked alone
        from diag.bench.accept_parts import accept_parts
        section(res, "accept", lambda: accept_parts(device=dev))
        save(res, out)
        if set(sections) == {"accept"}:
            return _finish(res, out)
    if dev == "cuda":                    # the routing's way picked on this device for every section after
        from diag.bench import routing_ab
        section(res, "routing", lambda: routing_ab.measure(dev, way=routing))
    peak = ceil["bf16_matmul_flops"] if ceil else 7.9e14

    def checkpoint():
        t0 = time.perf_counter()
        st["ks"] = kimi_shaped(workdir / "kimi", layers=layers, seed=0, device=dev, widths=widths,
                               drafter_widths=drafter_widths, successor_margin=SUCCESSOR_MARGIN)
        st["drafter_widths"] = {**(widths or {}), **(drafter_widths or {})}
        st["successor_margin"] = SUCCESSOR_MARGIN
        shards = sorted(st["ks"].target.glob("*.safetensors"))
        return {"layers": layers, "write_seconds": time.perf_counter() - t0, "successor_margin": SUCCESSOR_MARGIN,
                "checkpoint_bytes": st["ks"].bytes_on_disk, "shard_bytes": [f.stat().st_size for f in shards]}
    if section(res, "checkpoint", checkpoint) is None:
        return save(res, out) and res
    ks = st["ks"]
    if "load" in sections:
        from diag.bench.load import load_bench
        section(res, "load", lambda: load_bench(ks.target, dev))
        save(res, out)
    if "e2e" in sections:
        section(res, "e2e", lambda: _e2e(ks, layers, workdir, e2e_prompts, e2e_new_tokens, e2e_evaluate, dev,
                                             e2e_decoding, st, partial=keeper("e2e")))
        save(res, out)
        _release(dev)                          # the pipeline's model, before this run loads its own
    if not set(sections) & {"experts", "pass", "sampled", "grown", "drafter", "naive"}:
        return _finish(res, out)

    def model():
        t0 = time.perf_counter()
        st["model"] = load_int4(ks.target, dev)
        n = accelerate(st["model"])
        res_b = resident_bytes(st["model"])
        return {"load_seconds": time.perf_counter() - t0, "resident_bytes": res_b,
                "resident_over_checkpoint": res_b / ks.bytes_on_disk, "fast_experts": n}
    if section(res, "checkpoint_load", model) is None:
        return save(res, out) and res
    model = st["model"]
    moe = model.model.layers[1].mlp
    if "experts" in sections:
        section(res, "experts", lambda: experts_compare(moe, list(tokens), peak, eager_tokens=8192,
                                                        tile_budget_s=tile_budget_s))
        save(res, out)
    seqs = synthetic_sequences(num_seqs, seq_len, prompt_len, model.config.vocab_size)
    lays = sampled_layouts(ks.layout)
    points = tuple(dict.fromkeys(union_points([layout(x) for x in lays]) + (layout("final").points[0],)))
    if "pass" in sections:
        section(res, "pass_2layer", lambda: _two_layer(model, moe, seqs, points))
        save(res, out)
    if "sampled" in sections:
        section(res, "sampled", lambda: _sampled(st, model, lays, num_seqs, prompt_len, device=dev,
                                                 dtype=torch.float32 if dev == "cpu" else torch.bfloat16,
                                                 copy_bytes_per_s=(ceil or {}).get("copy_bytes_per_s"),
                                                 flops_per_s=(ceil or {}).get("bf16_matmul_flops"),
                                                 trees=sampled_trees, partial=keeper("sampled")))
        save(res, out)
    e2e_first = res["sections"].get("e2e", {}).get("first") or {}
    batch = int(e2e_first.get("target_generate_batch", 48))
    if "grown" in sections or "e2e" in sections:        # the e2e extrapolation reads grown's slopes
        section(res, "grown", lambda: _grown(model, seqs, points, max_layers, st, dev, batch))
        save(res, out)
    if "drafter" in sections or "naive" in sections:
        section(res, "drafter", lambda: _drafter(st, model, lays, peak, dev))
        save(res, out)
    if "naive" in sections:
        section(res, "naive", lambda: _naive(st, model, seqs, lays[0], prompt_len, res))
    return _finish(res, out)


def _finish(res: dict, out: Path) -> dict:
    """The greedy decode step against the copy bandwidth (grown and the ceilings) and the 61-layer
    extrapolation, when this run measured what each needs."""
    from diag.bench.extrapolate import extrapolate

    secs = res["sections"]
    grown, ceil = secs.get("grown", {}), secs.get("ceilings", {})
    if "error" not in grown and "generate_seconds_per_layer_step_by_batch" in grown and ceil.get("copy_bytes_per_s"):
        section(res, "decode_bandwidth", lambda: _decode_bandwidth(grown, ceil["copy_bytes_per_s"]))
    need = ("e2e", "grown", "load", "checkpoint")
    if all(n in secs and "error" not in secs[n] and "incomplete" not in secs[n] for n in need):
        section(res, "extrapolation", lambda: extrapolate(
            secs["e2e"], secs["grown"], secs["load"], secs["checkpoint"]["shard_bytes"],
            gpu_memory=res.get("machine", {}).get("gpu_memory_bytes"), copy_bytes_per_s=ceil.get("copy_bytes_per_s")))
        x = secs.get("extrapolation", {}).get("sampled")
        for key, goal in (x or {}).get("goals", {}).items():      # each term, the goal, met or not
            print(f"[bench] extrapolation.sampled.{key}: {x['terms'][key]} (goal <= {goal['limit']:g} s: "
                  f"{'undecided' if goal['met'] is None else 'met' if goal['met'] else 'NOT met'})")
    save(res, out)
    return res


def _decode_bandwidth(grown: dict, copy_bytes_per_s: float) -> dict:
    """The greedy decode step's bytes/s against the copy bandwidth (bench/bandwidth.py), timed by
    its steady step where the run measured it (_step_key); the added layer's routed share as the
    grown section measured it, or Kimi's for a run before it recorded one."""
    from diag.bench.bandwidth import decode_step_bandwidth, routed_bytes
    from diag.zoo.kimi_shaped import GROUP_SIZE, KIMI_TEXT

    got = grown.get("added_layer")
    t = KIMI_TEXT
    widths = ({"routed": got["routed_bytes"], "experts": got["experts"], "top_k": got["top_k"],
               "routed_from": "measured on the grown model"} if got else
              {"experts": t["n_routed_experts"], "top_k": t["num_experts_per_tok"],
               "routed": routed_bytes(t["n_routed_experts"], t["moe_intermediate_size"], t["hidden_size"], GROUP_SIZE),
               "routed_from": "Kimi's widths (the run recorded no added_layer)"})
    ours, other = _step_key(grown, "generate"), _step_key(grown, "transformers_generate")
    out = {**decode_step_bandwidth(grown, copy_bytes_per_s, key=ours, **widths), "timed_by": ours}
    if other in grown:                      # the path before the graphed steps, measured beside them
        out["transformers_generate"] = {**decode_step_bandwidth(grown, copy_bytes_per_s, key=other, **widths),
                                         "timed_by": other}
    return out


def _step_key(grown: dict, path: str) -> str:
    """The grown section's key of `path`'s per-layer decode step: the steady step (the call's
    fixed costs taken out, _generation_probe) where the run measured it, else the whole call's."""
    steady = f"{path}_steady_seconds_per_layer_step_by_batch"
    return steady if steady in grown else f"{path}_seconds_per_layer_step_by_batch"


def _release(dev: str) -> None:
    import gc

    gc.collect()
    if dev != "cpu":
        torch.cuda.empty_cache()


def _ceilings(dev: str) -> dict:
    if dev == "cpu":  # a smoke run: small, and no device copy worth measuring
        return {"bf16_matmul_flops": matmul_peak(dev, 512, 2, torch.float32)}
    return {"bf16_matmul_flops": matmul_peak(dev), "copy_bytes_per_s": copy_bandwidth(dev)}


def _e2e(ks, layers, workdir, prompts, new_tokens, evaluate, dev, decoding=None, st=None, partial=None) -> dict:
    from diag.bench.e2e_pair import bench_e2e
    from diag.bench.pair import PairRecipe

    out = bench_e2e(ks, layers, workdir, prompts=prompts, new_tokens=new_tokens, evaluate=evaluate, device=dev,
                    decoding=decoding, drafter_widths=(st or {}).get("drafter_widths") or {},
                    recipe=PairRecipe(**GPU_PAIR) if dev != "cpu" else None, partial=partial)
    _release(dev)
    return out


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


def _generation_probe(model, vocab: int, *, prompts: int = 16, prompt_len: int = 96,
                      new_tokens: int = 32, own_cache: bool = True) -> dict:
    """Seconds per decode step of greedy generation (one batch of `prompts`), as the
    pipeline's greedy_continuations runs it (own_cache False: transformers' generate, the path
    before issue 36's graphed steps): the per-layer slope of the e2e generate phase. The
    median of GENERATION_REPEATS timed runs (one run's step at batch 16 came out 3.0 and 4.9 ms a
    layer on two H100 calls). seconds_per_step is the whole call over its steps: the prefill,
    the step's graph capture and the read-back included, as an e2e call pays them. The call is
    timed again at a quarter of the new tokens, and steady_seconds_per_step is the difference
    over the steps between: the decode step alone, which bench/bandwidth.py sets against the
    bytes a step reads. Worked example: 64 new tokens 0.420 s, 16 new 0.130 s -> 6.56 ms a
    step whole, (0.420 - 0.130) / 48 = 6.04 ms steady."""
    from diag.target.generate import greedy_continuations

    gen = torch.Generator().manual_seed(5)
    ps = torch.randint(0, vocab, (prompts, prompt_len), generator=gen).tolist()
    short = max(1, new_tokens // 4)

    def call(n: int) -> float:
        return timed(lambda: greedy_continuations(model, ps, n, pad_id=0, eos_ids=set(), batch_size=prompts,
                                                  progress=False, own_cache=own_cache),
                     repeat=GENERATION_REPEATS, warmup=1)
    seconds, seconds_short = call(new_tokens), call(short)
    steady = (seconds - seconds_short) / (new_tokens - short) if new_tokens > short else None
    return {"prompts": prompts, "prompt_len": prompt_len, "new_tokens": new_tokens, "seconds": seconds,
            "seconds_per_step": seconds / new_tokens, "short_new_tokens": short, "seconds_short": seconds_short,
            "steady_seconds_per_step": steady, "repeats": GENERATION_REPEATS}


def _costs_probe(model, st, dev) -> dict:
    """Wall seconds of the pipeline's step-cost measurement (diagnoses/pricing/costs.py) on `model` with the
    e2e trees' num_draft_tokens: at two depths, the per-layer slope of timings.target_costs_s."""
    from diag.bench.e2e import TREES
    from diag.drafter.checkpoint import load_drafter
    from diag.diagnoses.pricing.costs import measure_costs
    from diag.trees import tree_shape

    try:
        if "costs_drafter" not in st:
            drafter, _ = load_drafter(st["ks"].drafter, dtype=torch.bfloat16 if dev != "cpu" else torch.float32)
            st["costs_drafter"] = drafter.to(dev)
        t0 = time.perf_counter()
        measure_costs(model, st["costs_drafter"], model.get_input_embeddings(),
                      [tree_shape(t).num_draft_tokens for t in TREES])
    except Exception as err:  # a probe's failure is data; the grown section's other rows stay
        return {"seconds": None, "error": repr(err)[-400:]}
    return {"seconds": time.perf_counter() - t0}


# The probe at the e2e's batch decodes after e2e-sized contexts (512 prompt tokens, 64 new):
# the KV cache's growth per step (transformers' DynamicCache concatenates each layer's keys
# and values) and the attention over it are per-layer costs that 96 + 32 tokens hide.
BATCH_PROBE = {"prompt_len": 512, "new_tokens": 64}
GENERATION_REPEATS = 3


def _grown(model, seqs, points, max_layers, st, dev, batch: int = 48) -> dict:
    """batch: the e2e run's generation batch (a second generation probe at it, BATCH_PROBE)."""
    from diag.bench import expert_split
    from diag.bench.round_slope import MIDDLE, fit, probe, split_fit, split_probe
    from diag.trees import tree_shape
    from diag.zoo.kimi_shaped import kimi_config
    from diag.target.placement import activation_bytes, place

    base_layers = len(model.model.layers)
    base_row, _ = capture_throughput(model, seqs, points, 16384)
    base_gen = _generation_probe(model, model.config.vocab_size)
    base_gen_b = _generation_probe(model, model.config.vocab_size, prompts=batch, **BATCH_PROBE)
    base_tf = [_generation_probe(model, model.config.vocab_size, own_cache=False),
               _generation_probe(model, model.config.vocab_size, prompts=batch, own_cache=False, **BATCH_PROBE)]
    _costs_probe(model, st, dev)                         # warm-up: first calls compile and allocate
    base_costs = _costs_probe(model, st, dev)
    base_rounds = probe(model, st.get("costs_drafter"), st["ks"].layout)   # the sampled loop's rounds
    # the experts' split, measured on the first routed layer (the same before and after growing), and
    # the loop with every layer as one GPU of the split runs it, on its slowest shard
    split = expert_split.probe(model, ids=torch.stack([s.ids[:64] for s in seqs[:16]]))   # + the model's routing
    busy = expert_split.slowest_shard(split, MIDDLE[1] * tree_shape(MIDDLE[0]).num_draft_tokens)
    base_split = split_probe(model, st.get("costs_drafter"), st["ks"].layout, expert_split.SHARDS, busy)
    reserve = activation_bytes(model.config, 16384) + 24 * GiB  # + drafter and its beam replay
    n = grow(model, layers_that_fit(model, reserve, max_layers))
    total = torch.cuda.get_device_properties(0).total_memory if dev != "cpu" else 64 * GiB
    try:
        place(kimi_config(n), 1, available=[total], token_budget=16384)
        planned = "fits"
    except Exception as err:  # the planner's verdict is data here
        planned = f"refused: {err}"
    rows = []
    for budget in (8192, 16384):
        row, st["tp"] = capture_throughput(model, seqs, points, budget)
        rows.append(row)
    gen = _generation_probe(model, model.config.vocab_size)
    gen_b = _generation_probe(model, model.config.vocab_size, prompts=batch, **BATCH_PROBE)
    tf = [_generation_probe(model, model.config.vocab_size, own_cache=False),
          _generation_probe(model, model.config.vocab_size, prompts=batch, own_cache=False, **BATCH_PROBE)]
    costs = _costs_probe(model, st, dev)
    rounds = probe(model, st.get("costs_drafter"), st["ks"].layout)
    split_rounds = split_probe(model, st.get("costs_drafter"), st["ks"].layout, expert_split.SHARDS, busy)
    st.pop("costs_drafter", None)
    weights = resident_bytes(model)
    added = n - base_layers
    slope = lambda g, b, key="seconds_per_step": (  # noqa: E731
        (g[key] - b[key]) / max(added, 1) if g.get(key) is not None and b.get(key) is not None else None)
    steady = lambda g, b: slope(g, b, "steady_seconds_per_step")  # noqa: E731
    return {"layers": n, "base_layers": base_layers, "weight_bytes": weights, "planner_on_this_gpu": planned,
            "activation_estimate_16k": activation_bytes(model.config, 16384), "rows": rows,
            "base_capture": base_row, "base_generation": base_gen, "generation": gen,
            "peak_over_weights": max(r.get("peak_bytes", weights) for r in rows) / weights,
            "capture_seconds_per_layer_token": (rows[-1]["seconds"] - base_row["seconds"]) / max(added, 1)
            / rows[-1]["tokens"],
            "generate_seconds_per_layer_step": slope(gen, base_gen),
            "generation_at_batch": {"base": base_gen_b, "grown": gen_b},
            "generate_seconds_per_layer_step_by_batch": {"16": slope(gen, base_gen), str(batch): slope(gen_b, base_gen_b)},
            "transformers_generation": {"base": base_tf, "grown": tf},
            "transformers_generate_seconds_per_layer_step_by_batch": {"16": slope(tf[0], base_tf[0]),
                                                                      str(batch): slope(tf[1], base_tf[1])},
            "generate_steady_seconds_per_layer_step_by_batch": {"16": steady(gen, base_gen),
                                                                str(batch): steady(gen_b, base_gen_b)},
            "transformers_generate_steady_seconds_per_layer_step_by_batch": {"16": steady(tf[0], base_tf[0]),
                                                                             str(batch): steady(tf[1], base_tf[1])},
            "costs_probe": {"base": base_costs, "grown": costs},
            "sampled_round_probe": {"base": base_rounds, "grown": rounds},
            "sampled_round_slope": fit(base_rounds, rounds, added),
            "expert_split": split,
            "split_round_probe": {"base": base_split, "grown": split_rounds},
            "split_round_slope": split_fit(base_split, split_rounds, added),
            "costs_seconds_per_layer": (costs["seconds"] - base_costs["seconds"]) / max(added, 1)
            if costs["seconds"] is not None and base_costs["seconds"] is not None else None,
            "added_layer": added_layer(model)}


def added_layer(model) -> dict | None:
    """The last layer's routed experts (an added MoE layer of the grown model): their bytes, how
    many, how many a token takes; None when the last layer has no routed experts."""
    experts = getattr(model.model.layers[-1].mlp, "experts", None)
    if experts is None:
        return None
    return {"routed_bytes": resident_bytes(experts), "experts": int(model.config.n_routed_experts),
            "top_k": int(model.config.num_experts_per_tok)}


def sampled_layouts(claimed: str) -> list[str]:
    """The pass / sampled / drafter sections' three layouts at any depth K >= 2: the drafter's
    claim and two that every K has. K = 2: embed+L1+L2, L1+L2+final, embed+L1+final;
    K = 6: embed+L3+L6, L1+L2+final, embed+L1+final (was L2+L3+L3: a point twice)."""
    return list(dict.fromkeys([claimed, "L1+L2+final", "embed+L1+final"]))


GRAPHS_AB = ("chain-3", "s3-k8-d16")      # the sampled section's verify graphs against eager, on these trees
GAP_TREES = ("chain-1", "s3-k8-d16")      # its unsynchronised rounds' device gaps (bench/round_gaps.py): the
                                          # worst cost in passes and the worst verify bandwidth
GPU_PAIR = {"steps": 300, "batch": 16, "lr": 1.5e-4}   # bench/pair.py's recipe at Kimi's widths (1e-3 diverged there)


def _sampled(st, model, lays, num_prompts, prompt_len, max_new_tokens: int = 64, *, device: str = "cuda",
             dtype=torch.bfloat16, trees=None, recipe=None, copy_bytes_per_s: float | None = None,
             flops_per_s: float | None = None, partial=None) -> dict:
    """The sampled section on `model` (on `device`) with the bench pair's trained drafter
    (bench/pair.py, trained here on these prompts' greedy continuations, cached; `drafter` says how
    it was made and what it accepts); device/dtype/trees/recipe let a CPU test run it. With the
    copy bandwidth, each tree's verify forward against it, and a profile of each tree's rounds (CUDA),
    synchronised by phase (round_profiles) and as a run goes (round_gaps, GAP_TREES)."""
    from diag.bench.pair import META, PairRecipe, pair_path, trained_pair_drafter, training_bytes
    from diag.bench.round_gaps import round_gaps
    from diag.errors import DiagError
    from diag.bench.sampled import (TREES, bench_prompts, graphs_ab, round_profile, sampled_bench, verify_bandwidth,
                                    verify_profile)
    from diag.drafter.checkpoint import load_drafter

    prompts = bench_prompts(num_prompts, prompt_len, model.config.vocab_size)
    widths = st.get("drafter_widths") or {}
    recipe = recipe or PairRecipe(**GPU_PAIR)
    cached = (pair_path(st["ks"].target, prompts, max_new_tokens, lays, widths, recipe) / META).is_file()
    if device == "cuda" and not cached:            # its training beside the target: room, or say so before it OOMs
        torch.cuda.empty_cache()
        need = training_bytes(widths)
        why = pair_fits(torch.cuda.mem_get_info()[0], need, len(model.model.layers),
                        resident_bytes(model.model.layers[-1]))
        if why:
            raise DiagError(why, field="--layers", expected=f"room for {need / 1e9:.1f} GB",
                            found=f"{len(model.model.layers)} layers")
    path, made = trained_pair_drafter(st["ks"].target, model, prompts, max_new_tokens, lays, widths, recipe=recipe)
    drafter, _ = load_drafter(path, dtype=dtype)
    drafter = drafter.to(device)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    out = sampled_bench(model, drafter, embed, head, lays, prompts, max_new_tokens=max_new_tokens,
                        token_budget=16384, trees=trees or TREES,
                        partial=lambda so_far: partial({**so_far, "drafter": made}) if partial else None)
    out["device"] = str(next(drafter.parameters()).device)
    out["drafter"] = {**made, "target_head": f"zoo.kimi_shaped successor head, margin {SUCCESSOR_MARGIN}"
                      if st.get("successor_margin") else "random"}
    if copy_bytes_per_s:
        verify_bandwidth(out, copy_bytes_per_s, flops_per_s)
    out["round_profiles"] = [round_profile(model, drafter, embed, head, lays, prompts, r["tree"])
                             for r in out["rows"]] if device == "cuda" else []
    out["verify_profiles"] = [verify_profile(model, drafter, embed, head, lays, prompts, r["tree"])
                              for r in out["rows"]] if device == "cuda" else []
    out["graphs_ab"] = [graphs_ab(model, drafter, embed, head, lays, prompts, t)
                        for t in GRAPHS_AB if t in {r["tree"] for r in out["rows"]}]
    out["round_gaps"] = [round_gaps(model, drafter, embed, head, lays, prompts, t)
                         for t in GAP_TREES if t in {r["tree"] for r in out["rows"]}] if device == "cuda" else []
    del drafter
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _drafter(st, model, lays, peak, dev) -> dict:
    from diag.drafter.checkpoint import load_drafter

    drafter, _ = load_drafter(st["ks"].drafter, dtype=torch.bfloat16 if dev != "cpu" else torch.float32)
    st["drafter"] = drafter.to(dev)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    out = replay_bench(st["drafter"], embed, head, st["tp"], lays, peak, token_budget=2048)
    st["replay"] = out
    return out


def _naive(st, model, seqs, lay, prompt_len, res) -> dict:
    """Today's naive loop (the drafter re-drafts every index), the one a competent user
    writes (fast experts, KV cache, drafts only at the newest index), with a profile of the
    latter, and the batched path's cost per position against both."""
    kw = dict(prompt_len=prompt_len, positions=8, steps=3)
    embed = model.get_input_embeddings()
    as_before = naive_loop(model, st["drafter"], embed, seqs[0].ids, lay, **kw)
    competent = naive_loop(model, st["drafter"], embed, seqs[0].ids, lay, newest_only=True, profile=True,
                           **{**kw, "positions": 10})
    out = {"as_before": as_before, "competent": competent,
           "seconds_per_position": competent["seconds_per_position"]}
    grown = res["sections"].get("grown", {})
    rows = grown.get("rows") or []
    if rows and "replay" in st:
        target_per_token = rows[-1]["seconds"] / rows[-1]["tokens"]
        rp = st["replay"]
        batched = target_per_token + rp["seconds"] / max(rp["rounds"], 1)
        out.update({"batched_seconds_per_position": batched,
                    "speedup_over_naive": competent["seconds_per_position"] / batched,
                    "speedup_over_naive_as_before": as_before["seconds_per_position"] / batched})
    return out
