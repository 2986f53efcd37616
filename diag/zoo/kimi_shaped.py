"""Kimi-shaped checkpoints: Kimi-K2.5's exact widths, K layers, random weights, written in
the real on-disk formats (compressed-tensors `pack-quantized` INT4 target, SGLang EAGLE-3
drafter), so loading, placement and speed can be exercised at Kimi's sizes without 550 GB.

Widths (Kimi-K2-Instruct / K2.5 text_config): hidden 7168, vocab 163840, 64 heads, MLA with
q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128; layer 0 dense
(intermediate 18432), every later layer MoE: 384 routed experts of 2048, top-8, 1 shared
expert, n_group 1 / topk_group 1, sigmoid scoring, routed_scaling_factor 2.827.
Bytes per MoE layer: 384 experts x 3 Linears x 2048 x 7168 / 2 (4-bit) = 8.46 GB packed,
+ 1.06 GB bf16 scales (one per 32 columns), + ~0.3 GB dense attention/shared/router.

Random weights are generated directly in their stored form: packed int32 words (uniform
nibbles, q in [-8, 7]) and bf16 scales; no bf16 expert is ever quantized. Scales make each
weight's std about 1/sqrt(in), so activations stay O(1) through K layers.

`successor_margin` (the GPU bench's target) replaces the random head by a successor map: each id
t has one successor succ(t) (a random cycle over the ordinary ids; the special ids lead into it and
are nobody's successor), and lm_head row succ(t) is margin / hidden * embed[t]. Where the last state
is t's own embedding the successor's logit is `margin` and every other one ~N(0, margin^2 / hidden);
the layers' outputs dilute it (at 2 layers the residual carries about as much again: measured at
shrunk widths, margin 22 gave the successor a logit of 11.0). So at Kimi's hidden 7168 (the others'
std margin / 85) greedy continuations follow succ whatever the rounding (a random head's argmax is
a near tie: bf16 noise flips it), and at T = 1 the successor keeps most of the mass (margin 26,
diluted to ~13: e^13 / (e^13 + 163840) ~ 0.7). The weights' bytes, shapes and kernels are the
random target's.

`widths` overrides any config key (a test shrinks hidden to 64); the config with real
widths is `kimi_config(layers)`. This module knows config keys and file layout; it knows
nothing about loading, placement or benchmarks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from diag.checkpoint.config import text_config
from diag.errors import DiagError
from diag.int4.format import PER_WORD, check_group
from diag.int4.scheme import KIMI_IGNORE, KIMI_K25_IGNORE, quantization_config
from diag.checkpoint.headers import INDEX
from diag.int4.skeleton import build_meta, is_fused_experts, resolve_config, targeted_linears

KIMI_TEXT: dict = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
    "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_nextn_predict_layers": 0,
    "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1,
    "n_routed_experts": 384, "num_experts_per_tok": 8, "routed_scaling_factor": 2.827,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# SpecForge configs/kimi-k2-eagle3.json: Llama-style EAGLE-3 head on Kimi's hidden states.
KIMI_DRAFTER: dict = {"hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 64,
                      "head_dim": 128, "intermediate_size": 18432, "draft_vocab_size": 32000,
                      "rope_theta": 1000000.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6}
GROUP_SIZE = 32
_Q_STD = math.sqrt((16 ** 2 - 1) / 12)  # std of q uniform on [-8, 7]: 4.61


@dataclass(frozen=True)
class KimiShaped:
    target: Path
    drafter: Path | None
    layout: str           # the layout the drafter's config says it was trained on
    bytes_on_disk: int    # target safetensors bytes


def kimi_config(layers: int, *, widths: dict | None = None, wrapper: bool = False,
                group_size: int = GROUP_SIZE) -> dict:
    """config.json of a K-layer Kimi-shaped INT4 target. wrapper=True writes K2.5's
    multimodal wrapper (text under `text_config`, weights under `language_model.`)."""
    if layers < 1:
        raise DiagError("a Kimi-shaped checkpoint needs at least one layer", field="layers",
                        expected=">= 1", found=layers)
    text = {**KIMI_TEXT, **(widths or {}), "num_hidden_layers": layers}
    text.update(special_ids(int(text["vocab_size"])))
    _check_widths(text, group_size)
    ignore = KIMI_K25_IGNORE if wrapper else KIMI_IGNORE
    text["quantization_config"] = quantization_config(group_size, ignore=ignore)
    if not wrapper:
        return text
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "quantization_config": quantization_config(group_size, ignore=ignore),
            "text_config": text, "vision_config": {}, "torch_dtype": "bfloat16"}


def special_ids(vocab: int) -> dict:
    """Kimi's special ids sit at fixed distances from the top of the vocabulary:
    163840 -> bos 163584, eos 163585, pad 163839; a shrunk vocabulary keeps the offsets
    (1024 -> 768, 769, 1023)."""
    return {"bos_token_id": vocab - 256, "eos_token_id": vocab - 255, "pad_token_id": vocab - 1}


def _check_widths(text: dict, group_size: int) -> None:
    for key in ("hidden_size", "moe_intermediate_size"):
        check_group(int(text[key]), group_size, field=key, file="kimi_config(widths=...)")
    if text["n_routed_experts"] % text["n_group"]:
        raise DiagError("routed experts do not split into n_group groups", field="n_group",
                        expected=f"a divisor of {text['n_routed_experts']}", found=text["n_group"])


def drafter_layout(layers: int) -> tuple[str, list[int] | None]:
    """The layout the random drafter claims, and SGLang (DeepSeek) ids for it.
    K >= 7: SGLang's default L2+L{K//2}+L{K-3}, ids [2, K//2, K-3] (K = 61: [2, 30, 58],
    Kimi's). Smaller K: embed+L{ceil(K/2)}+L{K}, which SGLang ids cannot express (None);
    at K = 6 the default would name L3 twice (6 // 2 = 6 - 3), so 6 is small too."""
    if layers >= 7:
        return f"L2+L{layers // 2}+L{layers - 3}", [2, layers // 2, layers - 3]
    return f"embed+L{(layers + 1) // 2}+L{layers}", None


# ---- tensors ---------------------------------------------------------------------------

class _Random:
    """Seeded generator of stored-form tensors, on `device`, returned on the CPU."""

    def __init__(self, seed: int, device: str):
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    def dense(self, shape: tuple[int, ...], std: float) -> torch.Tensor:
        t = torch.randn(shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (t * std).to(torch.bfloat16).cpu()

    def packed(self, out_f: int, in_f: int, group_size: int) -> dict[str, torch.Tensor]:
        """weight_packed int32 [out, in/8] (uniform words), weight_scale bf16 [out, in/g]
        around 1/(4.61 sqrt(in)), weight_shape int64 [2]."""
        words = torch.randint(-2 ** 31, 2 ** 31, (out_f, in_f // PER_WORD), generator=self.gen,
                              device=self.device, dtype=torch.int64).to(torch.int32)
        jitter = torch.rand((out_f, in_f // group_size), generator=self.gen, device=self.device)
        scale = (0.75 + 0.5 * jitter) / (_Q_STD * math.sqrt(in_f))
        return {"weight_packed": words.cpu(), "weight_scale": scale.to(torch.bfloat16).cpu(),
                "weight_shape": torch.tensor([out_f, in_f], dtype=torch.int64)}


def _dense_tensor(rng: _Random, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Norm weights 1, router bias 0 (fp32, as Kimi stores it), others N(0, 1/in)."""
    if name.endswith("e_score_correction_bias"):
        return torch.zeros(shape, dtype=torch.float32)
    if len(shape) == 1:
        return torch.ones(shape, dtype=torch.bfloat16)
    std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(shape[-1])
    return rng.dense(shape, std)


def _plan(config: dict) -> tuple[str, dict[str, tuple[int, ...]], dict[str, tuple[int, int]]]:
    """(prefix, dense tensor name -> shape, packed Linear name -> (out, in)), names as
    the checkpoint spells them, read off transformers' own (meta) model."""
    text = resolve_config(config)
    model = build_meta(text)
    fused = {n for n, m in model.named_modules() if is_fused_experts(m)}
    packed = targeted_linears(model, text.prefix, ("Linear",), tuple(text.quantization["ignore"]))
    dense = {}
    for name, t in model.state_dict(keep_vars=True).items():
        module = name.rpartition(".")[0]
        if module in fused or text.prefix + module in packed:
            continue  # fused experts are written per expert, packed; targeted Linears packed
        dense[text.prefix + name] = tuple(t.shape)
    return text.prefix, dense, packed


def _shard_of(name: str, prefix: str, layers: int) -> int:
    """Layer i's tensors go to shard i; everything else (embed, norm, head) to shard K."""
    rest = name.removeprefix(prefix).removeprefix("model.")
    if rest.startswith("layers."):
        return int(rest.split(".")[1])
    return layers


# ---- writing ---------------------------------------------------------------------------

def successor_map(vocab: int, seed: int) -> torch.Tensor:
    """succ [V] int64 (module docstring): a random cycle over the ordinary ids; special id s leads
    to the cycle's (s mod n)-th id. Example, V 8 with specials 0, 1, 7 (a shrunk vocabulary's
    offsets): ordinary ids 2..6 in one random cycle, succ(0), succ(1), succ(7) among them."""
    special = set(special_ids(vocab).values())
    ordinary = torch.tensor([i for i in range(vocab) if i not in special], dtype=torch.long)
    order = ordinary[torch.randperm(len(ordinary), generator=torch.Generator().manual_seed(seed))]
    succ = torch.empty(vocab, dtype=torch.long)
    succ[order] = order.roll(-1)
    for s in sorted(special):
        succ[s] = order[s % len(order)]
    return succ


def _successor_head(tensors: dict, margin: float, seed: int) -> None:
    """lm_head := the successor head of embed_tokens (module docstring), in place, bf16."""
    embed = next(n for n in tensors if n.endswith("embed_tokens.weight"))
    head = next(n for n in tensors if n.endswith("lm_head.weight"))
    e = tensors[embed].float()                                                   # [V, H]
    w = torch.zeros_like(e).index_add_(0, successor_map(e.shape[0], seed), e * (margin / e.shape[1]))
    tensors[head] = w.to(torch.bfloat16)


def write_target(out_dir: str | Path, layers: int, *, seed: int = 0, widths: dict | None = None,
                 wrapper: bool = False, device: str = "cpu", group_size: int = GROUP_SIZE,
                 successor_margin: float | None = None) -> Path:
    """Write config.json, one safetensors shard per layer (+ one for embed/norm/head) and
    model.safetensors.index.json. Peak host memory: one layer's tensors (the last shard's embed
    and head twice over in float32 with `successor_margin`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = kimi_config(layers, widths=widths, wrapper=wrapper, group_size=group_size)
    prefix, dense, packed = _plan(config)
    rng = _Random(seed, device)
    names = [f"model-{i + 1:05d}-of-{layers + 1:05d}.safetensors" for i in range(layers + 1)]
    weight_map: dict[str, str] = {}
    for shard in range(layers + 1):
        tensors = {n: _dense_tensor(rng, n, s) for n, s in dense.items()
                   if _shard_of(n, prefix, layers) == shard}
        for n, (o, i) in packed.items():
            if _shard_of(n, prefix, layers) == shard:
                tensors.update({f"{n}.{k}": v for k, v in rng.packed(o, i, group_size).items()})
        if shard == layers and successor_margin is not None:
            _successor_head(tensors, successor_margin, seed)
        save_file(tensors, str(out / names[shard]), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, names[shard]))
        del tensors
    total = sum((out / f).stat().st_size for f in names)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(out, text_config(config)["vocab_size"])
    return out


def write_tokenizer(out: Path, vocab: int) -> None:
    """A small byte-level BPE tokenizer (a few hundred trained ids), its vocabulary filled up
    to the target's `vocab` (Kimi: 163840) as real ones are, so `diag run` can tokenize prompts
    for a Kimi-shaped target and its tokenizer check sees a whole vocabulary."""
    from diag.zoo.tokenizer import padded_to
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|pad|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["def f(x):\n    return x + 1\n", "the quick brown fox jumps"] * 20, trainer)
    tok = padded_to(tok, vocab)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|eos|>")
    fast.save_pretrained(str(out))


def write_drafter(out_dir: str | Path, layers: int, *, seed: int = 1, widths: dict | None = None,
                  device: str = "cpu") -> tuple[Path, str]:
    """A random EAGLE-3 drafter with Kimi's drafter widths (fc 3*H -> H, draft vocab 32000),
    its d2t an arbitrary hot vocabulary; widths overrides shrink it for tests."""
    from diag.drafter.model import Eagle3Drafter
    from diag.drafter.checkpoint import save_drafter

    cfg, w, text = drafter_config(widths), {**KIMI_DRAFTER, **(widths or {})}, {**KIMI_TEXT, **(widths or {})}
    torch.manual_seed(seed)
    with torch.device(device):
        drafter = Eagle3Drafter(cfg)  # initialised where it is fast, written from the CPU
    drafter = drafter.cpu()
    drafter.set_vocab(_hot_ids(text["vocab_size"], w["draft_vocab_size"], seed))
    layout, ids = drafter_layout(layers)
    save_drafter(drafter, out_dir, aux_layer_ids=ids, trained_layout=layout)
    return Path(out_dir), layout


def drafter_config(widths: dict | None = None):
    """The Kimi-shaped drafter's DrafterConfig (KIMI_DRAFTER, widths overriding)."""
    from diag.drafter.model import DrafterConfig

    w = {**KIMI_DRAFTER, **(widths or {})}
    text = {**KIMI_TEXT, **(widths or {})}
    return DrafterConfig(hidden_size=w["hidden_size"], num_attention_heads=w["num_attention_heads"],
                         num_key_value_heads=w["num_key_value_heads"], head_dim=w["head_dim"],
                         intermediate_size=w["intermediate_size"], vocab_size=text["vocab_size"],
                         draft_vocab_size=w["draft_vocab_size"], target_hidden_size=text["hidden_size"],
                         rms_norm_eps=w["rms_norm_eps"], rope_theta=w["rope_theta"],
                         max_position_embeddings=w["max_position_embeddings"])


def _hot_ids(vocab: int, draft_vocab: int, seed: int) -> torch.Tensor:
    """draft_vocab distinct ascending target ids (a random hot vocabulary)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values


def kimi_shaped(out_dir: str | Path, layers: int = 2, seed: int = 0, *, widths: dict | None = None,
                drafter_widths: dict | None = None, wrapper: bool = False, drafter: bool = True,
                device: str = "cpu", successor_margin: float | None = None) -> KimiShaped:
    """A K-layer Kimi-shaped INT4 target under out_dir/target and a matching EAGLE-3
    drafter under out_dir/drafter."""
    root = Path(out_dir)
    target = write_target(root / "target", layers, seed=seed, widths=widths, wrapper=wrapper,
                          device=device, successor_margin=successor_margin)
    dpath, layout = (None, drafter_layout(layers)[0])
    if drafter:
        dw = {**(widths or {}), **(drafter_widths or {})}
        dpath, layout = write_drafter(root / "drafter", layers, seed=seed + 1, widths=dw, device=device)
    size = sum(f.stat().st_size for f in target.glob("*.safetensors"))
    return KimiShaped(target, dpath, layout, size)


def packed_layer_bytes(config: dict) -> int:
    """Stored bytes of one MoE layer's routed experts (packed int32 + bf16 scales).
    Real widths: 384 * 3 * 2048 * 7168 * (1/2 + 2/32) = 9.51e9."""
    text = text_config(config)
    n = text["n_routed_experts"] * 3 * text["moe_intermediate_size"] * text["hidden_size"]
    group = text["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"]
    return n // 2 + 2 * n // group
