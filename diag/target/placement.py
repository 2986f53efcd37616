"""Placement of a target's layers on N GPUs by a per-GPU memory budget (DESIGN.md §8).

accelerate's big-model machinery plans it: `get_balanced_memory` spreads the weights evenly,
`infer_auto_device_map` assigns whole decoder layers (never split) in order, embeddings first,
final norm and lm_head last; `dispatch_model` moves the weights and hands activations from
GPU to GPU. Sizes come from the model's parameters AND buffers at their stored dtype:
accelerate counts int32 buffers at 4 bytes per element, so a packed INT4 expert
([E, 2I, H/8] int32) counts at its packed size, 8x smaller than bf16 per weight.

Per GPU the plan leaves room for activations: `activation_budget` bytes, by default the
estimate `activation_bytes(config, token_budget)` (one token-budget batch through the widest
layer, the captured points, and one vocabulary chunk of logits). Worked example, Kimi
(H 7168, top-8 of 2048-wide experts), 16384 tokens, 4 captured points, vocab chunk 32768:
  layer   16384 * (8 * (2*2048 + 2048 + 7168) + 24 * 7168) * 2 B = 9.1 GB
  points  16384 * 4 * 7168 * 2 B                                  = 0.9 GB
  logits  16384 * 32768 * (2 + 4) B                               = 3.2 GB   -> 13.3 GB
The benchmark (diag.bench) measures the real peak against this estimate.

gpus = 0 means CPU only: no device map. This module knows sizes and devices; it knows
nothing about capture points, drafters or reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from diag.checkpoint.config import text_config
from diag.errors import DiagError

GiB = 2 ** 30
EXPERTS = ("layer", "split")   # [placement] experts: with their decoder layer, or split over the GPUs
_GROWTH = 24  # bf16 copies of the hidden state alive in one decoder layer (norms, MLA q/k/v, residuals)


def parse_bytes(text: str | int | None, *, field: str) -> int | None:
    """"80GiB" -> 85899345920, "75GB" -> 75e9, "512MiB", or an int of bytes."""
    if text is None or isinstance(text, int):
        return text
    from accelerate.utils import convert_file_size_to_int

    try:
        return int(convert_file_size_to_int(text.strip()))
    except ValueError as err:
        raise DiagError("not a memory size", field=field, expected="e.g. 80GiB, 75GB or 512MiB",
                        found=repr(text)) from err


def check_values(gpu_memory, activation_budget, *, file: str | None = None) -> None:
    """The placement's sizes parse, before anything runs (`diag validate` runs this too)."""
    for key, value in (("gpu_memory", gpu_memory), ("activation_budget", activation_budget)):
        try:
            parse_bytes(value, field=f"placement.{key}")
        except DiagError as err:
            raise DiagError(err.message, file=file, field=err.field, expected=err.expected, found=err.found) from err


def require_gpus(gpus: int, *, field: str = "placement.gpus", file: str | None = None,
                 gpu_memory: str | int | None = None, memory_field: str = "placement.gpu_memory") -> None:
    """`gpus` CUDA devices are visible to this torch, and a per-GPU budget fits the smallest of
    them, else a DiagError naming the flag: a CPU-only torch used to fail deep in the drafter's
    .to("cuda:0") with an AssertionError, a budget past the device's memory at the weights' load.
    Example: --gpus 2 on torch 2.13+cpu -> found "0 visible (torch 2.13.0+cpu is built without CUDA)";
    --gpu-memory 500GiB on 141 GiB H200s -> expected "<= 139.8 GiB", found "500.0 GiB"."""
    if gpus <= 0:
        return
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < gpus:
        why = (f"torch {torch.__version__} is built without CUDA" if torch.version.cuda is None
               else "CUDA_VISIBLE_DEVICES or the driver hides the others")
        raise DiagError("placement asks for more GPUs than this machine shows torch", file=file, field=field,
                        expected=f"{gpus} CUDA device(s)", found=f"{seen} visible ({why})",
                        hint="run with --gpus 0 (the CPU), or on a machine with the GPUs and a CUDA build of torch")
    budget = parse_bytes(gpu_memory, field=memory_field)
    if budget is not None:
        total = min(torch.cuda.get_device_properties(i).total_memory for i in range(gpus))
        if budget > total:
            raise DiagError("the per-GPU memory budget is more than the GPU has", file=file, field=memory_field,
                            expected=f"<= {_gib(total)} (the smallest of the {gpus} GPU(s))", found=_gib(budget),
                            hint="lower --gpu-memory, or leave it out to plan with each GPU's free memory")


def require_split_target(cfg: dict, quantization: str | None, *, file: str, field: str = "placement.experts") -> None:
    """`experts = "split"` holds each layer's routed experts as INT4 shards (diag.int4.sharded):
    the target must be a MoE whose experts are pack-quantized, checked from config.json before
    any weight is read. Example: Llama-3.1-8B -> found "quantization none, 0 routed experts"."""
    c = text_config(cfg)
    experts = int(c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts") or 0)
    if quantization != "pack-quantized" or experts < 2:
        raise DiagError("experts split over the GPUs needs a MoE target with INT4 routed experts", file=file,
                        field=field, expected="n_routed_experts >= 2 and a pack-quantized quantization_config "
                                              "(Kimi-K2.5, DeepSeek-V3 INT4)",
                        found=f"quantization {quantization or 'none'}, {experts} routed experts",
                        hint='experts = "layer" (the default)')


def require_bf16(gpus: int, dtype_name: str, *, field: str = "target.dtype", file: str | None = None) -> None:
    """bfloat16 weights on GPUs that cannot compute in it (before Ampere: V100, T4) are refused
    by name; on the CPU torch emulates bf16. dtype_name: the case's dtype, or the checkpoint's
    declared one for "auto" ("bfloat16", "bf16")."""
    if gpus <= 0 or dtype_name not in ("bfloat16", "bf16") or not torch.cuda.is_available():
        return
    if not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(0)
        raise DiagError("the GPUs cannot compute in bfloat16", file=file, field=field,
                        expected="a GPU with bfloat16 (compute capability >= 8.0: A100, H100, ...)",
                        found=f"{name} (compute capability {'.'.join(map(str, torch.cuda.get_device_capability(0)))})",
                        hint='set dtype = "float16" or "float32" in [target], or run on the CPU (--gpus 0)')


def activation_bytes(config, token_budget: int, *, num_points: int = 4, vocab_chunk: int = 32768) -> int:
    """Estimated peak activation bytes of one token-budget batch (see the module docstring)."""
    c = _cfg_dict(config)
    h = int(c["hidden_size"])
    experts = int(c.get("num_experts_per_tok") or 0) * 3 * int(c.get("moe_intermediate_size") or 0)
    dense = 3 * int(c.get("intermediate_size") or 0)
    width = max(experts + int(c.get("num_experts_per_tok") or 0) * h, dense) + _GROWTH * h
    layer = token_budget * width * 2
    points = token_budget * num_points * h * 2
    logits = token_budget * min(vocab_chunk, int(c["vocab_size"])) * 6
    return layer + points + logits


def _cfg_dict(config) -> dict:
    if isinstance(config, dict):
        return text_config(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return vars(config)


def place(model_or_config, gpus: int, gpu_memory: str | int | None = None,
          activation_budget: str | int | None = None, *, token_budget: int = 16384,
          available: list[int] | None = None, experts: str = "layer") -> dict | None:
    """A device map {module name: gpu index} for `gpus` GPUs, or None for gpus = 0 (CPU).
    gpu_memory: memory per GPU ("80GiB"); None means each visible GPU's free memory
    (`available` overrides the probe, for planning elsewhere). experts: "layer" (the routed
    experts go with their decoder layer) or "split" (split_experts: every layer's experts over
    all the GPUs)."""
    if gpus < 0:
        raise DiagError("negative GPU count", field="placement.gpus", expected=">= 0", found=gpus)
    if gpus == 0:
        return None
    model = _meta_model(model_or_config)
    per_gpu = _per_gpu_bytes(gpus, gpu_memory, available)
    act = parse_bytes(activation_budget, field="placement.activation_budget")
    act = activation_bytes(model.config, token_budget) if act is None else act
    room = {i: per_gpu[i] - act for i in range(gpus)}
    if min(room.values()) <= 0:
        raise DiagError("the activation budget leaves no room for weights",
                        field="placement.activation_budget", expected=f"< {_gib(min(per_gpu))} per GPU",
                        found=_gib(act))
    if experts not in EXPERTS:
        raise DiagError("unknown placement of the routed experts", field="placement.experts",
                        expected=" or ".join(f'"{e}"' for e in EXPERTS), found=repr(experts))
    if experts == "split":
        return split_experts(model, room, per_gpu, act)
    return _infer(model, room, per_gpu, act)


def split_experts(model: nn.Module, room: dict[int, int], per_gpu: list[int], act: int) -> dict:
    """Expert parallelism: each layer's routed experts in N contiguous shards, shard j on GPU j
    ({experts}.shards.{j}: j, diag.int4.sharded), the rest of the model placed by layers as
    `_infer` places it, in what the shards leave of each GPU. Worked example, Kimi on 8 GPUs of
    141 GB: 60 MoE layers x 9.5 GB of experts -> 48 experts a layer and 71 GB on each GPU;
    the other 23 GB (attention, shared experts, the dense layer, embeddings, head) by layers
    over the 70 GB left on each."""
    from accelerate.utils import compute_module_sizes

    from diag.int4.packed import PackedExperts
    from diag.int4.sharded import SHARDS, split_sizes

    gpus = len(room)
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, PackedExperts)]
    if not found:
        raise DiagError("experts split over the GPUs needs routed experts held as INT4", field="placement.experts",
                        expected="a pack-quantized MoE target (Kimi-K2.5, DeepSeek-V3 INT4)",
                        found="no packed routed experts in the target", hint='experts = "layer"')
    if gpus < 2:
        raise DiagError("experts split over the GPUs needs at least 2 GPUs", field="placement.experts",
                        expected="placement.gpus >= 2", found=gpus, hint='experts = "layer" on one GPU')
    sizes = compute_module_sizes(model, special_dtypes=_fp32_special(model))
    held = [0] * gpus
    shards = {}
    for name, module in found:
        per_expert = sizes[name] / module.num_experts
        for j, count in enumerate(split_sizes(module.num_experts, gpus)):
            held[j] += int(per_expert * count)
            shards[f"{name}.{SHARDS}.{j}"] = j
    left = {i: room[i] - held[i] for i in range(gpus)}
    if min(left.values()) <= 0:
        _not_enough(sum(held) + sizes[""] - sum(sizes[n] for n, _ in found), gpus, per_gpu, act)
    owners = [(model.get_submodule(n.rpartition(".")[0]), n.rpartition(".")[2], m) for n, m in found]
    try:                                      # the experts sized apart: the rest placed by layers
        for parent, leaf, _ in owners:
            setattr(parent, leaf, nn.Module())
        return {**_infer(model, left, per_gpu, act), **shards}
    finally:                                  # the caller's model, if it gave one, as it was
        for parent, leaf, module in owners:
            setattr(parent, leaf, module)


def _infer(model: nn.Module, room: dict[int, int], per_gpu: list[int], act: int) -> dict:
    """Even split: each GPU gets at most total/N + one decoder layer of weights (the slack
    lets whole layers land), never more than its room."""
    from accelerate.utils import compute_module_sizes

    no_split = list(getattr(model, "_no_split_modules", None) or [])
    special = _fp32_special(model)
    sizes = compute_module_sizes(model, special_dtypes=special)
    total = sizes[""]
    if total > sum(room.values()):
        _not_enough(total, len(room), per_gpu, act)
    layer = max((sizes[n] for n, m in model.named_modules() if type(m).__name__ in no_split), default=0)
    even = {i: min(r, total // len(room) + layer) for i, r in room.items()}
    for budget in (even, dict(room)):
        device_map = _accelerate_map(model, budget, no_split, special)
        if all(isinstance(d, int) for d in device_map.values()):
            return device_map
    _not_enough(total, len(room), per_gpu, act)


def _accelerate_map(model, budget: dict[int, int], no_split: list[str], special) -> dict:
    import logging

    from accelerate import infer_auto_device_map

    log = logging.getLogger("accelerate.utils.modeling")
    level = log.level
    log.setLevel(logging.ERROR)  # planning for GPUs this machine may not have is the point
    try:
        return dict(infer_auto_device_map(model, max_memory=dict(budget), no_split_module_classes=no_split,
                                          special_dtypes=special))
    finally:
        log.setLevel(level)


def _fp32_special(model: nn.Module) -> dict[str, torch.dtype]:
    """Parameters transformers keeps in fp32 under bf16 (DeepSeek-V3's router): counted at
    4 bytes; everything else is counted at the dtype it holds."""
    keep = tuple(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    return {n: torch.float32 for n, _ in model.named_parameters() if any(k in n for k in keep)}


def _not_enough(total: int, gpus: int, per_gpu: list[int], act: int) -> None:
    need = total / gpus + act
    fits = max(1, -(-total // max(min(per_gpu) - act, 1)))
    raise DiagError("the target does not fit on the GPUs given", field="placement.gpus",
                    expected=f"{_gib(need)} per GPU ({_gib(total)} of weights / {gpus} GPU(s) + "
                             f"{_gib(act)} activation budget), at least {fits} GPU(s) of this size",
                    found=f"{gpus} GPU(s) with {', '.join(_gib(b) for b in per_gpu)}",
                    hint="add GPUs (--gpus), lower --activation-budget / the token budget, "
                         "or raise --gpu-memory if the GPUs hold more")


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _per_gpu_bytes(gpus: int, gpu_memory, available: list[int] | None) -> list[int]:
    given = parse_bytes(gpu_memory, field="placement.gpu_memory")
    if given is not None:
        return [given] * gpus
    free = available if available is not None else _free_memory()
    if len(free) < gpus:
        raise DiagError("fewer GPUs are visible than placement asks for", field="placement.gpus",
                        expected=f"{gpus} CUDA device(s)", found=f"{len(free)} visible",
                        hint="set CUDA_VISIBLE_DEVICES, lower --gpus, or give --gpu-memory to plan only")
    return list(free[:gpus])


def _free_memory() -> list[int]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]


# ---- the model to size -------------------------------------------------------------------

def _meta_model(model_or_config) -> nn.Module:
    """A module to size: the model itself, or an empty (meta) one built from a config."""
    if isinstance(model_or_config, nn.Module):
        return model_or_config
    from diag.int4.skeleton import build_meta, resolve_config

    cfg = model_or_config if isinstance(model_or_config, dict) else model_or_config.to_dict()
    text = resolve_config(cfg)
    model = build_meta(text).to(torch.bfloat16)
    if text.quantization is not None:
        _pack_on_meta(model, text)
    return model


def _pack_on_meta(model: nn.Module, text) -> None:
    """Replace what the quantization config targets by packed modules on meta, so sizes are
    packed sizes (the same replacement diag.int4.load makes before reading weights)."""
    from diag.int4.packed import PackedExperts, PackedLinear
    from diag.int4.scheme import LINEAR_CLASSES, parse_quantization_config
    from diag.int4.skeleton import EXPERT_PROJ, is_fused_experts

    scheme = parse_quantization_config(text.quantization)
    for name, module in list(model.named_modules()):
        if is_fused_experts(module):
            group = scheme.group_for(f"{text.prefix}{name}.0.{EXPERT_PROJ[0]}", LINEAR_CLASSES)
            new = None if group is None else PackedExperts.like(module, group.group_size, device="meta")
        elif isinstance(module, nn.Linear):
            classes = tuple(c.__name__ for c in type(module).__mro__)
            group = scheme.group_for(text.prefix + name, classes)
            new = None if group is None else PackedLinear.like(module, group.group_size, device="meta")
        else:
            continue
        if new is not None:
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, new)


def device_map_for(path: str | Path, gpus: int, gpu_memory: str | int | None = None,
                   activation_budget: str | int | None = None, *, token_budget: int = 16384,
                   experts: str = "layer") -> dict | None:
    """The device map for the checkpoint at `path` (no weights read), or None for CPU."""
    if gpus == 0:
        return None
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise DiagError("target checkpoint has no config.json", file=str(cfg_file),
                        expected="a transformers config.json", found="missing")
    return place(json.loads(cfg_file.read_text()), gpus, gpu_memory, activation_budget,
                 token_budget=token_budget, experts=experts)


def plan_summary(model_or_config, device_map: dict | None) -> dict:
    """Bytes per device under a device map: {"0": 71.2e9, ...} (what the report records)."""
    from accelerate.utils import compute_module_sizes

    if device_map is None:
        return {}
    from diag.int4.sharded import shard_of, split_sizes

    model = _meta_model(model_or_config)
    sizes = compute_module_sizes(model, special_dtypes=_fp32_special(model))
    split = {}                                               # experts module -> its shards' count
    for name in device_map:
        if (got := shard_of(name)) is not None:
            split[got[0]] = max(split.get(got[0], 0), got[1] + 1)
    out: dict[str, int] = {}
    for name, dev in device_map.items():
        if (got := shard_of(name)) is not None:
            owner, j = got
            num = model.get_submodule(owner).num_experts
            size = sizes[owner] * split_sizes(num, split[owner])[j] // num
        else:
            size = sizes[name] - sum(sizes[o] for o in split if name == "" or o.startswith(name + "."))
        out[str(dev)] = out.get(str(dev), 0) + size
    return out


def dispatch(model: nn.Module, device_map: dict | None) -> nn.Module:
    """Move a loaded (CPU) model onto its devices; activations then travel from GPU to GPU
    through accelerate's hooks. None: the model stays where it is."""
    if device_map is None:
        return model
    from accelerate import dispatch_model

    return dispatch_model(model, device_map=device_map)
