"""Reading EAGLE-3 drafter checkpoints strictly (DESIGN.md §3), headers first.

`inspect_drafter` reads config.json and the safetensors headers only (no tensor): it detects
the format, architecture and options (checkpoint.drafter_format), builds the DrafterConfig
(config.py) and checks every tensor name, shape and dtype against the module that config
implies. The pipeline runs it before any target weight is read, so a wrong architecture or a
missing weight costs seconds. `load_drafter` then reads the tensors.

Tensors, by canonical name (drafter_format.canonical_name):
  required   every parameter of the module: fc, midlayer.*, norm; lm_head [Vd, H] unless the
             target's head is used; fc_norm.{i} / input_norm when the config enables them
  optional   embed_tokens.weight [V, H] (kept: the drafter's own table); d2t int [Vd] and
             t2d bool [V] when Vd = V (identity); lm_head.weight [V, H] when the target's head
             is used (SGLang's set_embed_and_head replaces it: noted, not used)
  MLA        fused_qkv_a_proj_with_mqa [q_lora + kv_lora + rope, 2H] may stand for q_a_proj +
             kv_a_proj_with_mqa (rows split in that order, as SGLang concatenates them)
Anything else is an error naming the file and key; a weight that only a config flag would use
(fc_norm.0.weight without fc_norm) names the flag. This module knows files and names; the
arithmetic lives in model.py.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from diag.checkpoint.config import read_config_json
from diag.checkpoint.finite import check_finite
from diag.checkpoint.drafter_format import DrafterFormat, canonical_names, detect, flat_config
from diag.checkpoint.dtypes import check_header_dtypes
from diag.checkpoint.headers import TORCH_DTYPES, TensorInfo, tensor_infos
from diag.drafter.config import drafter_config
from diag.drafter.model import DrafterConfig, Eagle3Drafter
from diag.drafter.save import save_drafter  # noqa: F401  (re-exported: writers import it from here)
from diag.errors import DiagError

FUSED_A = "midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"
_A_PARTS = ("midlayer.self_attn.q_a_proj.weight", "midlayer.self_attn.kv_a_proj_with_mqa.weight")
_FLAG_OF = {"fc_norm.": "fc_norm", "input_norm.": "norm_before_fc",
            "midlayer.self_attn.q_norm.": "transformer_layer_config.model_type qwen3",
            "midlayer.self_attn.k_norm.": "transformer_layer_config.model_type qwen3"}
_INT_DTYPES = ("I64", "I32", "I16", "I8", "U8")


@dataclass(frozen=True)
class DrafterCheckpoint:
    path: Path
    config: dict                 # config.json as read
    flat: dict                   # the same, speculators' layer config lifted to the top
    format: DrafterFormat
    cfg: DrafterConfig
    weight_files: tuple[str, ...]
    names: dict                  # checkpoint tensor name -> canonical name
    notes: tuple[str, ...]

    def to_json(self) -> dict:
        return self.format.to_json()


def read_config(path: Path) -> dict:
    return read_config_json(path, "drafter")


def _where(path: Path, files: tuple[str, ...]) -> str:
    return str(path / files[0]) if len(files) == 1 else f"{path}/{{{','.join(files)}}}"


def _expected(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the module `cfg` implies (built on the meta device)."""
    with torch.device("meta"):
        model = Eagle3Drafter(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in ("d2t", "t2d")}


def _optional(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    out = {"embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}
    if cfg.lm_head_from_target:
        out["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return out


def _fold_fused(found: dict[str, TensorInfo], cfg: DrafterConfig) -> dict[str, TensorInfo]:
    """An MLA checkpoint's fused_qkv_a_proj_with_mqa stands for its two halves."""
    if FUSED_A not in found or cfg.mla is None:
        return found
    info, m = found[FUSED_A], cfg.mla
    rows = (m.q_lora_rank, m.kv_lora_rank + m.qk_rope_head_dim)
    if tuple(info.shape) != (sum(rows), 2 * cfg.hidden_size):
        raise DiagError("drafter weight has the wrong shape for its config", file=str(info.file), field=FUSED_A,
                        expected=[sum(rows), 2 * cfg.hidden_size], found=list(info.shape))
    out = {k: v for k, v in found.items() if k != FUSED_A}
    for name, r in zip(_A_PARTS, rows):
        out[name] = TensorInfo(name, info.file, info.dtype, (r, 2 * cfg.hidden_size))
    return out


def check_tensors(found: dict[str, TensorInfo], cfg: DrafterConfig, where: str) -> list[str]:
    """Names, shapes and dtypes against the module; returns notes. `found` by canonical name."""
    expected, optional = _expected(cfg), _optional(cfg)
    found = _fold_fused(found, cfg)
    for key, shape in expected.items():
        if key not in found:
            raise DiagError("drafter checkpoint is missing a weight (it would stay randomly initialised)",
                            file=where, field=key, expected=f"tensor {list(shape)}", found="missing")
    allowed = {**expected, **optional, **_vocab_shapes(cfg)}
    _unexpected(sorted(set(found) - set(allowed)), where)
    for key, info in found.items():
        if tuple(info.shape) != tuple(allowed[key]):
            hint = ""
            if cfg.lm_head_from_target and key in ("d2t", "lm_head.weight") and info.shape[0] < cfg.vocab_size:
                hint = (f" (config.json has no draft_vocab_size, so the head is read as the target's over "
                        f"all {cfg.vocab_size} ids; this checkpoint's {key} has {info.shape[0]} rows: "
                        f"\"draft_vocab_size\": {info.shape[0]} is probably missing)")
            raise DiagError("drafter weight has the wrong shape for its config" + hint, file=where, field=key,
                            expected=list(allowed[key]), found=list(info.shape))
    _check_vocab_tensors(found, cfg, where)
    return (["lm_head.weight in the checkpoint is replaced by the target's lm_head (no draft_vocab_size: the "
             "engine loads the head from the target)"] if cfg.lm_head_from_target and "lm_head.weight" in found else [])


def _vocab_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    return {"d2t": (cfg.draft_vocab_size,), "t2d": (cfg.vocab_size,)}


def _unexpected(extra: list[str], where: str) -> None:
    for key in extra:
        flag = next((f for prefix, f in _FLAG_OF.items() if key.startswith(prefix)), None)
        if flag is not None:
            raise DiagError("drafter checkpoint holds a weight its config does not enable (the engine drops it)",
                            file=where, field=key, expected=f"config flag {flag} set, or no such tensor",
                            found="the tensor without the flag")
    if extra:
        raise DiagError("drafter checkpoint holds weights this drafter format does not use", file=where,
                        field=", ".join(extra[:5]), expected="only the module's weights, embed_tokens, d2t, t2d",
                        found=f"{len(extra)} unexpected tensor(s)")


def _check_vocab_tensors(found: dict[str, TensorInfo], cfg: DrafterConfig, where: str) -> None:
    if cfg.draft_vocab_size < cfg.vocab_size and "d2t" not in found:
        raise DiagError("drafter has a draft vocabulary but no d2t map", file=where, field="d2t",
                        expected=f"int64 [{cfg.draft_vocab_size}] (draft id -> target id offsets)",
                        found="missing: draft ids would be read as target ids")
    if "d2t" in found and found["d2t"].dtype not in _INT_DTYPES:
        raise DiagError("d2t is not an integer tensor", file=where, field="d2t",
                        expected="I64", found=found["d2t"].dtype)


def _headers(path: Path) -> tuple[dict[str, TensorInfo], tuple[str, ...]]:
    if not list(path.glob("*.safetensors")):
        raise DiagError("drafter checkpoint holds no weights", file=str(path),
                        expected="*.safetensors (or pytorch_model.bin converted to safetensors)",
                        found="no .safetensors file (model.safetensors or model-*-of-*.safetensors)")
    infos = tensor_infos(path)
    return infos, tuple(sorted({i.file.name for i in infos.values()}))


def inspect_drafter(path: str | Path) -> DrafterCheckpoint:
    """Everything about a drafter checkpoint that config.json and the headers say; no tensor read."""
    path = Path(path)
    config = read_config(path)
    cfile = str(path / "config.json")
    infos, files = _headers(path)
    where = _where(path, files)
    check_header_dtypes(infos, config, what="drafter", config_file=cfile)
    fmt = detect(config, infos.keys(), file=cfile)
    names = canonical_names(infos, fmt.attention, file=where)
    found = {names[k]: v for k, v in infos.items()}
    fc = found.get("fc.weight")
    if fc is None:
        raise DiagError("drafter checkpoint is missing a weight (it would stay randomly initialised)",
                        file=where, field="fc.weight", expected="tensor [H, k*H_target]", found="missing")
    flat = flat_config(config, file=cfile)
    cfg = drafter_config(flat, fmt, tuple(fc.shape), file=cfile)
    notes = check_tensors(found, cfg, where)
    return DrafterCheckpoint(path, config, flat, fmt, cfg, files, names, tuple(notes))


def _read(ckpt: DrafterCheckpoint, device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, checked finite. On the CPU (device None or cpu) from the
    files' memory maps; on a GPU read straight into its tensors there (_read_to_device)."""
    infos = tensor_infos(ckpt.path)
    if device is not None and torch.device(device).type != "cpu":
        out = _read_to_device(ckpt, infos, torch.device(device))
    else:
        out = _read_mapped(ckpt, infos)
    if FUSED_A in out:
        m = ckpt.cfg.mla
        q, kv = out.pop(FUSED_A).split([m.q_lora_rank, m.kv_lora_rank + m.qk_rope_head_dim])
        out.update(dict(zip(_A_PARTS, (q, kv))))
    return out


def _read_to_device(ckpt: DrafterCheckpoint, infos: dict[str, TensorInfo], device: torch.device) -> dict[str, torch.Tensor]:
    """Floating tensors read by checkpoint.reader (threads, pinned staging, one copy each) into
    empty tensors on `device`, integer ones (d2t, t2d: the maps checked on the CPU) into CPU
    tensors; each floating one checked finite where it landed. A Kimi-K2.5-width drafter is
    2.4 GB: memory-mapped, then `.to(cuda)` from pageable memory, it is read twice over.
    Example: fc.weight BF16 [7168, 21504] at offset 4096 of model.safetensors ->
    Piece(model.safetensors, 4096, torch.empty([7168, 21504], bfloat16, cuda:0))."""
    from diag.checkpoint.reader import Piece, read_pieces

    pieces, names = [], []
    for name, info in infos.items():
        dtype = TORCH_DTYPES.get(info.dtype)
        if dtype is None:
            raise DiagError("drafter tensor of a dtype diag cannot read", file=str(info.file), field=name,
                            expected=sorted(TORCH_DTYPES), found=info.dtype)
        where = device if dtype.is_floating_point else torch.device("cpu")
        pieces.append(Piece(info.file, info.offset, torch.empty(info.shape, dtype=dtype, device=where)))
        names.append(name)
    read_pieces(pieces)
    for name, piece in zip(names, pieces):
        check_finite(name, piece.dest, str(piece.file))
    return {ckpt.names[n]: p.dest for n, p in zip(names, pieces)}


def _read_mapped(ckpt: DrafterCheckpoint, infos: dict[str, TensorInfo]) -> dict[str, torch.Tensor]:
    by_file: dict[Path, list[str]] = {}
    for name, info in infos.items():
        by_file.setdefault(info.file, []).append(name)
    out = {}
    for f, names in by_file.items():
        try:
            with safe_open(str(f), framework="pt") as fh:
                shard = {n: fh.get_tensor(n) for n in names}
        except Exception as err:  # safetensors raises several types for corrupt files
            raise DiagError("cannot read safetensors file", file=str(f),
                            expected="a valid safetensors file", found=str(err)) from err
        for n, t in shard.items():
            check_finite(n, t, str(f))
        out.update({ckpt.names[n]: t for n, t in shard.items()})
    return out


_RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                 "xavier_uniform_", "xavier_normal_")


@contextmanager
def _unfilled(dtype: torch.dtype):
    """Modules built inside allocate their parameters in `dtype` (the default dtype while inside)
    without the random fill (torch.nn.init's random initialisers return their tensor untouched),
    as transformers' no_init_weights does: a Kimi-width drafter's 1e9 weights took 8.5 s of
    kaiming_uniform_ and 2.7-5 s of float32 -> bf16 conversion on 2 cores, all overwritten by the
    load. Deterministic buffers are computed as before: RoPE's frequencies in float32 (transformers
    asks for float32 explicitly), d2t / t2d as integers."""
    saved = {name: getattr(torch.nn.init, name) for name in _RANDOM_INITS}
    default = torch.get_default_dtype()
    for name in _RANDOM_INITS:
        setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(default)
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32, *,
                 target_head: torch.nn.Module | None = None,
                 device: torch.device | str | None = None) -> tuple[Eagle3Drafter, DrafterCheckpoint]:
    """Load a drafter strictly (inspect_drafter first). A drafter scoring with the target's
    lm_head (no draft_vocab_size) gets `target_head` bound; without it, logits() refuses.
    `device`: where it will run; a GPU's weights are read straight there (_read), the rest of
    the module follows with .to(device). None: the CPU."""
    ckpt = inspect_drafter(path)
    cfg, tensors = ckpt.cfg, _read(ckpt, device)
    with _unfilled(dtype):                     # every parameter is overwritten by the strict load below
        model = Eagle3Drafter(cfg)
    emb = tensors.pop("embed_tokens.weight", None)
    if cfg.lm_head_from_target:
        tensors.pop("lm_head.weight", None)
    if "d2t" not in tensors:                                  # Vd = V: the identity map
        tensors["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
        tensors["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
    tensors.setdefault("t2d", _t2d_of(tensors["d2t"], cfg.vocab_size))
    _check_map(tensors["d2t"], tensors["t2d"], _where(ckpt.path, ckpt.weight_files))
    # assign: the module takes the file's tensors as they are (no 2 GB copy at Kimi's widths); the
    # .to(dtype) below converts those stored in another dtype
    model.load_state_dict({k: v.long() if k == "d2t" else v for k, v in tensors.items()}, strict=True, assign=True)
    if emb is not None:
        model.embed_tokens = torch.nn.Embedding.from_pretrained(emb.float(), freeze=True)
    if cfg.lm_head_from_target and target_head is not None:
        model.use_target_head(target_head)
    model = model.to(dtype)
    return (model if device is None else model.to(device)).eval(), ckpt


def _t2d_of(d2t: torch.Tensor, vocab: int) -> torch.Tensor:
    """SGLang never reads t2d; a checkpoint without one gets it from d2t."""
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[(torch.arange(len(d2t)) + d2t.long()).clamp(0, vocab - 1)] = True
    return t2d


def _check_map(d2t: torch.Tensor, t2d: torch.Tensor, where: str) -> None:
    mapped = torch.arange(len(d2t)) + d2t.long()
    if mapped.min() < 0 or mapped.max() >= len(t2d):
        raise DiagError("d2t maps draft ids outside the target vocabulary", file=where, field="d2t",
                        expected=f"0 <= d + d2t[d] < {len(t2d)}",
                        found=f"range [{int(mapped.min())}, {int(mapped.max())}]")
    if not bool(t2d.bool()[mapped].all()) or int(t2d.sum()) != len(d2t):
        raise DiagError("d2t and t2d disagree about the hot vocabulary", file=where, field="t2d",
                        expected=f"t2d true exactly at d + d2t[d] ({len(d2t)} ids)",
                        found=f"{int(t2d.sum())} true entries")
