"""Load a compressed-tensors `pack-quantized` checkpoint as a transformers
model whose INT4 weights stay packed (PackedExperts / PackedLinear).

Steps: config.json -> text model config (skeleton.py: K2.5 wrapper,
kimi_k2 -> deepseek_v3, auto_map never run) -> empty model on the meta
device -> targeted modules replaced by packed ones -> a plan mapping every
checkpoint key to the tensor it fills -> every key checked (missing,
unexpected, shapes, weight_shape, scales) before any weight is read -> load.
transformers only warns when weights stay random (e.g. `kimi_k2` experts);
here anything left unloaded is a DiagError naming the tensor.

This module knows the checkpoint-to-model mapping; numerics live in
format.py, headers in diag.checkpoint.headers, reading bytes in
diag.checkpoint.reader, module trees in skeleton.py.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from diag.checkpoint.finite import check_finite
from diag.errors import DiagError
from diag.int4.format import check_group, packed_width
from diag.int4.packed import PackedExperts, PackedLinear
from diag.int4.sharded import SHARDS, ShardedExperts
from diag.int4.scheme import Int4Scheme, matches, parse_quantization_config
from diag.checkpoint.headers import TORCH_DTYPES, TensorInfo, tensor_infos
from diag.checkpoint.identity import memoised_digest, prime_digest
from diag.checkpoint.reader import Piece, ReadStats, read_pieces
from diag.int4.skeleton import (EXPERT_PROJ, TextModel, build_meta, fp32_names,
                                ignorable_unexpected, is_fused_experts, resolve_config)

_PACKED = ("weight_packed", "weight_scale", "weight_shape")


@dataclass(frozen=True)
class Slot:
    """One checkpoint key and where it goes: `target` is a parameter/buffer
    name of the model, `index` selects a slice of it (expert e, row range).
    kind: "dense" (cast to the model dtype), "packed" (int32 as stored),
    "scale" (kept in its stored dtype), "shape" (checked, not stored)."""

    key: str
    target: str
    kind: str
    shape: tuple[int, ...]  # expected checkpoint shape
    index: tuple = ()


def device_of(name: str, device) -> torch.device:
    """Where a module's tensors live: `device` itself, or, for an accelerate device map
    {module name: gpu index | "cpu"}, the entry of the longest prefix of `name`.
    Example: {"model.layers.0": 0, "model.layers.1": 1} -> "model.layers.1.mlp" on cuda:1."""
    if not isinstance(device, dict):
        return torch.device(device)
    best = max((k for k in device if k == "" or name == k or name.startswith(k + ".")), key=len, default=None)
    if best is None:
        raise DiagError("device map does not place a module", field=name,
                        expected="a device map covering every module", found=sorted(device)[:5])
    where = device[best]
    return torch.device(f"cuda:{where}" if isinstance(where, int) else where)


def load_packed_target(path, *, dtype: torch.dtype = torch.bfloat16, device="cpu",
                       digest: bool | None = None) -> nn.Module:
    """An INT4 pack-quantized checkpoint -> eval-mode transformers causal LM.
    `device`: one device, or an accelerate device map (each tensor is created on its own
    GPU and read into by diag.checkpoint.reader: parallel reads, pinned staging, copies to
    every GPU overlapping the reads; then accelerate's hooks are added). `digest`: see
    _load. `model.diag_read_stats` says how many bytes were read and how fast."""
    root = Path(path)
    cfg_file = root / "config.json"
    text = resolve_config(json.loads(cfg_file.read_text()), file=str(cfg_file))
    if text.quantization is None:
        raise DiagError("checkpoint has no quantization_config", file=str(cfg_file),
                        field="quantization_config", expected="a pack-quantized config",
                        found="none (load it with from_pretrained)")
    scheme = parse_quantization_config(text.quantization, file=str(cfg_file))
    infos = tensor_infos(root)
    model = build_meta(text)
    slots = _install_packed(model, scheme, text, infos, device)
    slots += _dense_slots(model, slots, text.prefix)
    used = _check_keys(model, text, scheme, slots, infos, root)
    stats = _load(model, slots, infos, used, dtype=dtype, device=device, digest=digest)
    _tie_or_fail(model, root)
    model.diag_load_notes = text.notes
    model.diag_read_stats = stats
    if isinstance(device, dict):
        if any(isinstance(m, ShardedExperts) for m in model.modules()):
            return dispatch_split(model, device).eval()
        from accelerate import dispatch_model
        return dispatch_model(model, device_map=device).eval()
    return model.to(device).eval()  # moves computed buffers (rotary tables) too


def dispatch_split(model: nn.Module, device_map: dict) -> nn.Module:
    """accelerate's hooks for a model whose tensors already sit where `device_map` puts them,
    experts split over devices: each module the map names (shards aside) gets its inputs moved
    to its device, the model its outputs back to its inputs' device. accelerate's
    dispatch_model would first move every tensor of a mapped layer to that layer's device,
    its experts' shards too (Kimi: a layer's 9.5 GB onto one GPU, and back); here only the
    tensors the load did not place (made at the model's construction) move, and ShardedExperts
    sends each shard its inputs."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    for name, module in model.named_modules():      # tensors made outside the load (the router's bias,
        if not (module._parameters or module._buffers):   # rotary tables) go where their module runs
            continue
        want = device_of(name, device_map)
        for group in (module._parameters, module._buffers):
            for key, t in group.items():
                if t is not None and t.device != want:
                    moved = t.data.to(want)
                    group[key] = nn.Parameter(moved, requires_grad=t.requires_grad) \
                        if isinstance(t, nn.Parameter) else moved
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True))
    for name, where in device_map.items():
        if name == "" or f".{SHARDS}." in f"{name}.":
            continue
        module = model.get_submodule(name)
        add_hook_to_module(module, AlignDevicesHook(execution_device=device_of(name, device_map)))
    model.hf_device_map = dict(device_map)
    return model


# ---- packed modules ------------------------------------------------------

def _install_packed(model: nn.Module, scheme: Int4Scheme, text: TextModel,
                    infos: dict[str, TensorInfo], device) -> list[Slot]:
    """Replace quantized Linear / fused experts by packed modules; their slots."""
    slots: list[Slot] = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear):
            slots += _maybe_packed_linear(model, name, module, scheme, text, infos, device)
        elif is_fused_experts(module):
            slots += _maybe_packed_experts(model, name, module, scheme, text, infos, device)
    return slots


def _group_size(scheme: Int4Scheme, name: str, prefix: str, class_names, infos) -> int | None:
    """Group size if the config quantizes the text model's Linear `name`; checks the
    checkpoint (keys `prefix + name`) agrees. Targets and ignore entries are matched against
    the text model's module names, as SGLang builds the K2.5 wrapper's language model with
    prefix "" for compressed-tensors (kimi_k25.py): "lm_head" ignores `language_model.lm_head`."""
    ckpt_name = prefix + name
    group = scheme.group_for(name, class_names)
    stored = f"{ckpt_name}.weight_packed" in infos
    if group is None and stored:
        raise DiagError("a Linear is stored INT4 but the quantization_config does not target it",
                        file=str(infos[f"{ckpt_name}.weight_packed"].file),
                        field=f"{ckpt_name}.weight_packed", expected="listed in targets, not in ignore",
                        found="ignored or untargeted")
    if group is not None and f"{ckpt_name}.weight" in infos:
        raise DiagError("the quantization_config targets a Linear that is stored dense",
                        file=str(infos[f"{ckpt_name}.weight"].file), field=f"{ckpt_name}.weight",
                        expected="weight_packed/weight_scale/weight_shape (or an ignore entry)",
                        found="a dense weight")
    return None if group is None else group.group_size


def _classes(module: nn.Module) -> tuple[str, ...]:
    return tuple(c.__name__ for c in type(module).__mro__)


def _maybe_packed_linear(model, name, module, scheme, text, infos, device) -> list[Slot]:
    ckpt = text.prefix + name
    gs = _group_size(scheme, name, text.prefix, _classes(module), infos)
    if gs is None:
        return []
    check_group(module.in_features, gs, field=f"{ckpt}.weight_scale", file="config.json")
    new = PackedLinear.like(module, gs, device=device_of(name, device))
    _set_module(model, name, _with_scale_dtype(new, infos, f"{ckpt}.weight_scale"))
    out_f, in_f = module.out_features, module.in_features
    return _packed_slots(ckpt, f"{name}.weight", out_f, in_f, gs, ())


def _packed_slots(ckpt: str, target: str, out_f: int, in_f: int, gs: int, index: tuple) -> list[Slot]:
    """The three compressed tensors of one Linear. target "x.weight" -> buffers
    "x.weight_packed", "x.weight_scale"; expert targets name the stacked buffers."""
    packed_t, scale_t = (target + "_packed", target + "_scale")
    return [Slot(f"{ckpt}.weight_packed", packed_t, "packed", (out_f, packed_width(in_f)), index),
            Slot(f"{ckpt}.weight_scale", scale_t, "scale", (out_f, in_f // gs), index),
            Slot(f"{ckpt}.weight_shape", "", "shape", (out_f, in_f))]


def _maybe_packed_experts(model, name, module, scheme, text, infos, device) -> list[Slot]:
    num, two_i, hidden = module.gate_up_proj.shape
    inter = two_i // 2
    names = [f"{name}.{e}.{p}" for e in range(num) for p in EXPERT_PROJ]
    sizes = {_group_size(scheme, n, text.prefix, ("Linear", "Module"), infos) for n in names}
    if len(sizes) > 1:
        raise DiagError("routed experts of one layer are quantized differently", field=name,
                        file="config.json", expected="one scheme for all experts", found=sorted(
                            str(s) for s in sizes))
    gs = sizes.pop()
    if gs is None:
        return _dense_expert_slots(name, text.prefix, num, inter, hidden)
    first, down = text.prefix + names[0], text.prefix + names[2]
    check_group(hidden, gs, field=f"{first}.weight_scale", file="config.json")
    check_group(inter, gs, field=f"{down}.weight_scale", file="config.json")
    shard_devices = _shard_devices(name, device)
    if shard_devices:
        new = ShardedExperts.like(module, gs, shard_devices)
        for shard in new.shards:
            _with_scale_dtype(shard, infos, f"{first}.weight_scale")
        _set_module(model, name, new)
        return [s for j, shard in enumerate(new.shards) for e in range(shard.num_experts)
                for s in _expert_packed(name, text.prefix, shard.first_expert + e, inter, hidden, gs,
                                        owner=f"{name}.{SHARDS}.{j}", local=e)]
    new = PackedExperts.like(module, gs, device=device_of(name, device))
    _set_module(model, name, _with_scale_dtype(new, infos, f"{first}.weight_scale"))
    return [s for e in range(num) for s in _expert_packed(name, text.prefix, e, inter, hidden, gs)]


def _shard_devices(name: str, device) -> list[torch.device]:
    """The devices of an experts module's shards where the device map splits it
    ({name}.shards.0 .. .shards.{N-1}, diag.target.placement's `experts = "split"`), else []."""
    if not isinstance(device, dict):
        return []
    out = []
    while f"{name}.{SHARDS}.{len(out)}" in device:
        out.append(device_of(f"{name}.{SHARDS}.{len(out)}", device))
    return out


def _expert_rows(proj: str, inter: int) -> slice:
    """Rows of gate_up_proj[e] that a projection fills: gate [0, I), up [I, 2I)."""
    return slice(0, inter) if proj == "gate_proj" else slice(inter, 2 * inter)


def _expert_packed(name, prefix, e, inter, hidden, gs, *, owner: str | None = None,
                   local: int | None = None) -> list[Slot]:
    """Expert e's slots; into `owner` (a shard, default the experts module) at `local`
    (default e)."""
    owner, local = owner or name, e if local is None else local
    out = []
    for proj in EXPERT_PROJ:
        ckpt = f"{prefix}{name}.{e}.{proj}"
        if proj == "down_proj":
            out += _packed_slots(ckpt, f"{owner}.down_proj", hidden, inter, gs, (local,))
        else:
            out += _packed_slots(ckpt, f"{owner}.gate_up_proj", inter, hidden, gs,
                                 (local, _expert_rows(proj, inter)))
    return out


def _dense_expert_slots(name, prefix, num, inter, hidden) -> list[Slot]:
    out = []
    for e in range(num):
        for proj in EXPERT_PROJ:
            key = f"{prefix}{name}.{e}.{proj}.weight"
            if proj == "down_proj":
                out.append(Slot(key, f"{name}.down_proj", "dense", (hidden, inter), (e,)))
            else:
                out.append(Slot(key, f"{name}.gate_up_proj", "dense", (inter, hidden),
                                (e, _expert_rows(proj, inter))))
    return out


_SCALE_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def _with_scale_dtype(module: nn.Module, infos: dict[str, TensorInfo], key: str) -> nn.Module:
    """Hold scales in their stored dtype: compressed-tensors dequantizes in it."""
    stored = _SCALE_DTYPES.get(infos[key].dtype) if key in infos else None
    for name, buf in list(module.named_buffers()):
        if name.endswith("_scale") and stored is not None:
            setattr(module, name, buf.to(stored))
    return module


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


# ---- everything else -----------------------------------------------------

def _dense_slots(model: nn.Module, taken: list[Slot], prefix: str) -> list[Slot]:
    """Parameters and persistent buffers not fed by a packed/expert slot are
    loaded under their own name (plus the wrapper prefix)."""
    covered = {s.target for s in taken}
    out = []
    for target, t in model.state_dict(keep_vars=True).items():
        if target in covered or target.endswith(_PACKED):
            continue
        out.append(Slot(prefix + target, target, "dense", tuple(t.shape)))
    return out


def _tied(model: nn.Module) -> dict[str, str]:
    """lm_head.weight -> model.embed_tokens.weight when embeddings are tied."""
    cfg = getattr(model, "config", None)
    if not getattr(cfg, "tie_word_embeddings", False):
        return {}
    keys = getattr(model, "_tied_weights_keys", None) or {}
    return dict(keys) if isinstance(keys, dict) else {}


def _check_keys(model, text: TextModel, scheme: Int4Scheme, slots: list[Slot],
                infos: dict[str, TensorInfo], root: Path) -> set[str]:
    """Fail on missing, unexpected or misshapen tensors; the keys to read."""
    tied = _tied(model)
    wanted = {s.key: s for s in slots}
    for key, s in wanted.items():
        if key not in infos and not (s.target in tied and key.removeprefix(text.prefix) in tied):
            _missing(key, s, infos, root)
        elif key in infos and tuple(infos[key].shape) != _stored_shape(s):
            raise DiagError("a checkpoint tensor has the wrong shape", file=str(infos[key].file),
                            field=key, expected=list(_stored_shape(s)), found=list(infos[key].shape))
    _check_unexpected(model, text, scheme, wanted, infos)
    return set(wanted) & set(infos)


def _stored_shape(s: Slot) -> tuple[int, ...]:
    """Shape on disk: weight_shape is a [2] vector holding s.shape = (out, in)."""
    return (len(s.shape),) if s.kind == "shape" else s.shape


def _missing(key: str, slot: Slot, infos: dict[str, TensorInfo], root: Path) -> None:
    if key.endswith("weight_scale") and key.replace("weight_scale", "weight_packed") in infos:
        raise DiagError("an INT4 weight has no weight_scale",
                        file=str(infos[key.replace("weight_scale", "weight_packed")].file),
                        field=key, expected="weight_scale next to weight_packed", found="missing")
    raise DiagError("a model tensor is missing from the checkpoint (it would stay uninitialised)",
                    file=str(root), field=key, expected=f"a tensor of shape {list(slot.shape)}",
                    found="no such key in any shard")


def _check_unexpected(model, text: TextModel, scheme: Int4Scheme, wanted: dict[str, Slot],
                      infos: dict[str, TensorInfo]) -> None:
    skip = [re.compile(p) for p in ignorable_unexpected(model)]
    for key, info in infos.items():
        if key in wanted:
            continue
        if text.prefix and not key.startswith(text.prefix):
            _check_non_text(key, info, scheme)
            continue
        if any(p.search(key.removeprefix(text.prefix)) for p in skip):
            continue
        raise DiagError("the checkpoint holds a tensor the model has no place for",
                        file=str(info.file), field=key, expected="a key of the model's state dict",
                        found=f"unexpected {info.dtype} {list(info.shape)}")


def _check_non_text(key: str, info: TensorInfo, scheme: Int4Scheme) -> None:
    """Vision/projector weights of a wrapper are skipped, but a quantized one
    that the ignore list does not name means the config does not describe
    the checkpoint."""
    module = key.rpartition(".")[0]
    if key.endswith(".weight_packed") and not matches(module, ("Linear", "Module"), scheme.ignore):
        raise DiagError("a non-text module is stored INT4 but is missing from the ignore list",
                        file=str(info.file), field=key, expected="an ignore entry such as "
                        "re:vision_tower.* (diag loads the text model only)", found="quantized")


# ---- reading -------------------------------------------------------------

def _load(model, slots: list[Slot], infos: dict[str, TensorInfo], used: set[str], *,
          dtype: torch.dtype, device, digest: bool | None = None) -> ReadStats:
    """Every used slot read once by diag.checkpoint.reader, straight into its tensor when
    the stored dtype is the tensor's (INT4 words, scales, bf16 weights of a bf16 model),
    else into a CPU buffer that is then cast. `digest`: hash every shard during the read (the
    identity digest, checkpoint.identity) and prime the content-digest memo (None: only shards
    the memo does not know or does not believe)."""
    keep32 = fp32_names(model) if dtype in (torch.float16, torch.bfloat16) else ()
    unfed_ties = {s.target for s in slots if s.key not in used}  # tied lm_head only
    _materialise(model, dtype, keep32, device, skip=unfed_ties)
    # name -> tensor, looked up once: get_submodule per slot costs ~0.5 ms of Python, and
    # Kimi-K2.5 has 60 * 384 * 3 * 3 = 207360 expert slots (~100 s) before any byte is read
    tensors = {**dict(model.named_parameters(remove_duplicate=False)),
               **dict(model.named_buffers(remove_duplicate=False))}
    pieces, keys, after = [], [], []
    for s in slots:
        if s.key in used:
            piece, then = _piece(tensors, s, infos[s.key])
            pieces.append(piece)
            keys.append(s.key)
            if then is not None:
                after.append(then)
    stats = read_pieces(pieces, digest_files=_to_digest({p.file for p in pieces}, digest))
    for key, piece in zip(keys, pieces):          # as read, before any cast (integers skipped)
        check_finite(key, piece.dest, str(piece.file))
    for then in after:
        then()
    for f, (sha, stat) in stats.digests.items():
        prime_digest(f, stat, sha)
    return stats


def _to_digest(files: set[Path], digest: bool | None) -> set[Path]:
    if digest is False:
        return set()
    return set(files) if digest else {f for f in files if memoised_digest(f) is None}


def _piece(tensors: dict[str, torch.Tensor], s: Slot, info: TensorInfo):
    """(Piece, None) reading straight into the slot's tensor, or (Piece into a CPU buffer,
    a function that checks or casts it into place once read)."""
    stored = TORCH_DTYPES.get(info.dtype)
    if s.kind == "packed" and info.dtype != "I32":
        raise DiagError("weight_packed is not int32", file=str(info.file), field=s.key,
                        expected="I32", found=info.dtype)
    if stored is None:
        raise DiagError("a checkpoint tensor has a dtype diag cannot load", file=str(info.file),
                        field=s.key, expected=sorted(TORCH_DTYPES), found=info.dtype)
    size = math.prod(info.shape) * torch.empty((), dtype=stored).element_size()
    if size != info.nbytes:
        raise DiagError("corrupt safetensors header: a tensor's byte range disagrees with its shape",
                        file=str(info.file), field=s.key, expected=f"{size} bytes ({info.dtype} "
                        f"{list(info.shape)})", found=f"{info.nbytes} bytes")
    if s.kind != "shape":
        dest = tensors[s.target]
        view = dest[s.index] if s.index else dest
        if view.dtype == stored and view.is_contiguous():
            return Piece(info.file, info.offset, view.data), None
    tmp = torch.empty(info.shape, dtype=stored)
    return Piece(info.file, info.offset, tmp), lambda: _apply(tensors, s, tmp, info)


def _materialise(model: nn.Module, dtype, keep32: tuple[str, ...], device, *, skip: set[str]) -> None:
    """Meta parameters/buffers -> empty real tensors (fp32 where transformers
    keeps them in fp32); every one is then overwritten by a slot. `skip`
    (a tied lm_head without its own tensor) stays on meta until tied."""
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type != "meta" or name in skip:
            continue
        want = torch.float32 if any(k in name for k in keep32) else dtype
        want = t.dtype if not t.dtype.is_floating_point else want
        parent, _, leaf = name.rpartition(".")
        mod = model.get_submodule(parent) if parent else model
        real = torch.empty(t.shape, dtype=want, device=device_of(parent, device))
        if leaf in mod._parameters:
            mod._parameters[leaf] = nn.Parameter(real, requires_grad=False)
        else:
            mod._buffers[leaf] = real


def _apply(tensors: dict[str, torch.Tensor], s: Slot, t: torch.Tensor, info: TensorInfo) -> None:
    if s.kind == "shape":
        if [int(v) for v in t.tolist()] != list(s.shape):
            raise DiagError("weight_shape does not match the model", file=str(info.file),
                            field=s.key, expected=list(s.shape), found=t.tolist())
        return
    dest = tensors[s.target]
    with torch.no_grad():
        view = dest[s.index] if s.index else dest
        view.copy_(t.to(view.dtype))


def _tie_or_fail(model: nn.Module, root: Path) -> None:
    """Tie lm_head to the embeddings when the config says so and the
    checkpoint has no lm_head; then refuse anything still on meta."""
    for dst, src in _tied(model).items():
        d_parent, _, d_leaf = dst.rpartition(".")
        mod = model.get_submodule(d_parent) if d_parent else model
        if isinstance(mod, nn.Linear) and mod._parameters[d_leaf].device.type == "meta":
            mod._parameters[d_leaf] = model.get_parameter(src)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type == "meta":
            raise DiagError("a model tensor stayed uninitialised", file=str(root), field=name,
                            expected="loaded from the checkpoint", found="never loaded")
