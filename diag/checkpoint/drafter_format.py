"""Which kind of EAGLE-3 drafter a checkpoint is, from its config.json and (when present) its
tensor names: the format, the architecture, the trainer that wrote it, the EAGLE-3.1 options.

Formats (DESIGN.md §3):
  sglang-eagle3  LlamaForCausalLMEagle3 (SGLang llama_eagle3.py, SpecForge, TorchSpec) or
                 Eagle3DeepseekV2ForCausalLM (MLA attention, SGLang kimi_k25_eagle3.py);
                 layer keys at the top of config.json, ids in eagle_config.
  speculators    Eagle3Speculator / Eagle3DraftModel (speculators 0.9 Eagle3SpeculatorConfig):
                 the layer's keys inside `transformer_layer_config`, the rest at the top.
                 `flat_config` lifts them to the top so every reader sees one shape:
                 {"transformer_layer_config": {"hidden_size": 64, ...}, "draft_vocab_size": 32}
                 -> {"hidden_size": 64, ..., "draft_vocab_size": 32}.

Options, as the engines and trainers read them:
  fc_norm              per-chunk RMSNorm of each capture point before fc; `fc_norm` or the legacy
                       `use_aux_norm` (SGLang); weights fc_norm.{i}.weight (legacy aux_norm_low /
                       aux_norm_mid / aux_norm_high)
  norm_before_fc       one RMSNorm over the whole concatenation; `eagle_config.norm_before_fc`
                       or top level (llama_eagle3.py, speculators); weight input_norm.weight
  norm_output          carry norm(r) into the next step instead of r
  norm_before_residual speculators only: the residual is hidden_norm(h), not h
  qk_norm              per-head q/k RMSNorm: speculators with a qwen3 transformer_layer_config
  lm_head              "drafter" (its own, draft_vocab_size rows) or "target" (no
                       draft_vocab_size: the full vocabulary through the target's lm_head)
Variant: "eagle3.1" when fc_norm or norm_output is set (the two flags kimi_k25_eagle3.py
names as EAGLE-3.1), else "eagle3".

Trainer: "speculators" (its format), "torchspec" (its eagle_config keys
use_input_layernorm_in_first_layer / use_last_layernorm / use_mtp_layernorm), "diag" (the
zoo's configs), else "unknown": a LlamaForCausalLMEagle3 config does not say who wrote it.

Canonical tensor names are diag's module names: midlayer.*, fc.weight, fc_norm.{i}.weight,
input_norm.weight, norm.weight, lm_head.weight, embed_tokens.weight, d2t, t2d. `canonical_name`
maps what checkpoints spell: `layers.0.` -> `midlayer.`, a leading `model.` dropped (Llama only:
SGLang's MLA loader skips `model.`-prefixed weights, so that is an error), aux_norm_* -> fc_norm.*.

This module knows config keys and tensor names; nothing about tensors' values or models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from diag.errors import DiagError

# The name of the EAGLE-3 checkpoint format most trainers write (ids in eagle_config, keys midlayer.*),
# as report.json's drafter.format enum spells it (schema/report.schema.json): a value users read in
# reports, not an engine rule; checkpoint/ comes before engines/ and asks none of them.
EAGLE3_FORMAT = "sglang-eagle3"
LLAMA_ARCH = "LlamaForCausalLMEagle3"
MLA_ARCH = "Eagle3DeepseekV2ForCausalLM"
SPECULATORS_ARCHS = ("Eagle3Speculator", "Eagle3DraftModel")
_MTP_HINT = ("an MTP (NextN) head, not an EAGLE-3 drafter: a server runs it with its NEXTN / MTP "
             "speculative algorithm from the target's own checkpoint; diag does not replay it")
_TORCHSPEC_KEYS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm")
_LEGACY_FC_NORM = {"aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}


@dataclass(frozen=True)
class DrafterOptions:
    fc_norm: bool = False
    norm_before_fc: bool = False
    norm_output: bool = False
    norm_before_residual: bool = False
    qk_norm: bool = False
    lm_head: str = "drafter"            # "drafter" | "target"
    embed_tokens: bool | None = None    # ships its own embedding table; None: not known (no weights)


@dataclass(frozen=True)
class DrafterFormat:
    format: str            # EAGLE3_FORMAT | "speculators"
    architecture: str      # architectures[0] as written
    attention: str         # "llama" (GQA) | "mla" (DeepSeek-V2 multi-latent)
    trainer: str           # "speculators" | "torchspec" | "diag" | "unknown"
    variant: str           # "eagle3" | "eagle3.1"
    options: DrafterOptions

    def to_json(self) -> dict:
        return {"format": self.format, "architecture": self.architecture,
                "attention": self.attention, "trainer": self.trainer, "variant": self.variant,
                "options": asdict(self.options)}


def is_speculators(config: dict) -> bool:
    return any(k in config for k in ("speculators_model_type", "speculators_config",
                                     "transformer_layer_config"))


def is_drafter_config(config: dict) -> bool:
    """A config.json that describes an EAGLE-3 drafter (any format), e.g. given as the target."""
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    return arch in (LLAMA_ARCH, MLA_ARCH, *SPECULATORS_ARCHS) or is_speculators(config) or "eagle_config" in config


def not_a_drafter(directory, config: dict, *, field: str) -> None:
    """DiagError when the target's config.json is a drafter's (it used to fail as a tokenizer,
    or be linted as a 1-layer target)."""
    if is_drafter_config(config):
        raise DiagError("the target checkpoint is an EAGLE-3 drafter checkpoint", file=f"{directory}/config.json",
                        field=field, expected="the target model (e.g. LlamaForCausalLM, DeepseekV3ForCausalLM)",
                        found=f"architectures {config.get('architectures')}",
                        hint="pass the drafter as --drafter and the model it drafts for as --target")


def flat_config(config: dict, *, file: str | None = None) -> dict:
    """The drafter config with speculators' transformer_layer_config lifted to the top level
    (top-level keys win: architectures, draft_vocab_size, target_hidden_size, ids, flags)."""
    if not is_speculators(config):
        return config
    kind = config.get("speculators_model_type", "eagle3")
    if kind != "eagle3":
        raise DiagError("unsupported speculators model type", file=file, field="speculators_model_type",
                        expected='"eagle3" (Eagle3SpeculatorConfig)', found=repr(kind))
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise DiagError("speculators config lacks its layer config", file=file,
                        field="transformer_layer_config",
                        expected="an object with hidden_size, num_attention_heads, ...", found=layer)
    return {**layer, **{k: v for k, v in config.items() if k != "transformer_layer_config"}}


def _architecture(config: dict, file: str | None) -> tuple[str, str, str]:
    """(format, architecture, attention), or a DiagError naming architectures."""
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if is_speculators(config):
        return "speculators", arch or SPECULATORS_ARCHS[0], "llama"
    if arch == LLAMA_ARCH:
        return EAGLE3_FORMAT, arch, "llama"
    if arch == MLA_ARCH:
        return EAGLE3_FORMAT, arch, "mla"
    hint = _MTP_HINT if arch and "NextN" in arch else None
    raise DiagError("not an EAGLE-3 drafter diag can load", file=file, field="architectures",
                    expected=f"[{LLAMA_ARCH!r}], [{MLA_ARCH!r}] or a speculators eagle3 config",
                    found=archs, hint=hint)


def _flag(config: dict, *keys: str) -> bool:
    return any(bool(config.get(k)) for k in keys)


def _eagle(config: dict) -> dict:
    e = config.get("eagle_config")
    return e if isinstance(e, dict) else {}


def trainer_marks(config: dict) -> str:
    """Who wrote the config, where it says so (module docstring); "unknown" otherwise."""
    if is_speculators(config):
        return "speculators"
    if any(k in _eagle(config) for k in _TORCHSPEC_KEYS):
        return "torchspec"
    return "diag" if "diag_trained_layout" in config else "unknown"


def _options(flat: dict, fmt: str, attention: str, names: frozenset[str] | None, layer_type: str | None,
             file: str | None) -> DrafterOptions:
    eagle = _eagle(flat)
    before_fc = bool(eagle.get("norm_before_fc", flat.get("norm_before_fc", False)))
    if before_fc and attention == "mla":
        raise DiagError("norm_before_fc is not an option of the MLA drafter", file=file,
                        field="norm_before_fc", expected="false (kimi_k25_eagle3.py builds no input_norm)",
                        found=True)
    if flat.get("tie_word_embeddings"):
        raise DiagError("a drafter whose lm_head is its embedding table is not supported", file=file,
                        field="tie_word_embeddings", expected="false (an own lm_head, or none: the target's)",
                        found=True)
    return DrafterOptions(
        fc_norm=_flag(flat, "fc_norm", "use_aux_norm"), norm_before_fc=before_fc,
        norm_output=_flag(flat, "norm_output"),
        norm_before_residual=fmt == "speculators" and _flag(flat, "norm_before_residual"),
        qk_norm=layer_type == "qwen3",
        lm_head="target" if flat.get("draft_vocab_size") is None else "drafter",
        embed_tokens=None if names is None else "embed_tokens.weight" in names)


def canonical_name(name: str, attention: str, *, file: str | None = None) -> str:
    """A checkpoint's tensor name -> diag's. "layers.0.mlp.up_proj.weight" ->
    "midlayer.mlp.up_proj.weight"; "model.fc.weight" -> "fc.weight" (Llama);
    "aux_norm_mid.weight" -> "fc_norm.1.weight"."""
    if name.startswith("model."):
        if attention == "mla":
            raise DiagError("the MLA drafter loader skips model.-prefixed weights", file=file,
                            field=name, expected="layers.0.* / midlayer.*, fc.*, norm.*, lm_head.* "
                            "(kimi_k25_eagle3.py load_weights; the skipped weights would stay random)",
                            found="a model. prefix")
        name = name[len("model."):]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    head, dot, rest = name.partition(".")
    if attention == "llama" and head in _LEGACY_FC_NORM:
        name = _LEGACY_FC_NORM[head] + dot + rest
    return name


def canonical_names(names, attention: str, *, file: str | None = None) -> dict[str, str]:
    """{checkpoint name: canonical name}; two names landing on one is an error."""
    out: dict[str, str] = {}
    for n in sorted(names):
        c = canonical_name(n, attention, file=file)
        if c in out.values():
            first = next(k for k, v in out.items() if v == c)
            raise DiagError("two drafter tensors load into one weight", file=file, field=f"{first}, {n}",
                            expected="one spelling per weight", found=f"both map to {c}")
        out[n] = c
    return out


def detect(config: dict, names=None, *, file: str | None = None) -> DrafterFormat:
    """The drafter's format from config.json and (optionally) its tensor names."""
    fmt, arch, attention = _architecture(config, file)
    flat = flat_config(config, file=file)
    layers = flat.get("num_hidden_layers", 1)
    if layers != 1:
        raise DiagError("diag replays one-layer EAGLE-3 drafters", file=file, field="num_hidden_layers",
                        expected=1, found=layers)
    if attention == "mla" and not flat.get("q_lora_rank"):
        raise DiagError("the MLA drafter needs q_lora_rank", file=file, field="q_lora_rank",
                        expected="a positive integer (kimi_k25_eagle3.py raises without it)",
                        found=flat.get("q_lora_rank"))
    canon = None if names is None else frozenset(canonical_names(names, attention, file=file).values())
    layer_type = (config.get("transformer_layer_config") or {}).get("model_type") if fmt == "speculators" else None
    opts = _options(flat, fmt, attention, canon, layer_type, file)
    variant = "eagle3.1" if opts.fc_norm or opts.norm_output else "eagle3"
    return DrafterFormat(fmt, arch, attention, trainer_marks(config), variant, opts)
