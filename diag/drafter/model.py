"""The EAGLE-3 drafter (DESIGN.md §3) as a torch module, batched over positions.

One draft step at sequence index j (input token x_{j+1}, hidden h_j):
  e = embed(x_{j+1});  h = fc(aux_j) on the first step only (when width != H)
  a = attn(cat[input_layernorm(e), hidden_norm(h)])   RoPE, over earlier positions
  r = a + h;  r = r + mlp(post_attention_layernorm(r))
  logits = lm_head(norm(r))  (draft vocabulary);  next step carries r (norm(r) if norm_output)
  draft id -> target id: t = d + d2t[d]
Variants (config flags, DESIGN.md §3): before fc, input_norm over the concatenation
(norm_before_fc) and one fc_norm per capture point (fc_norm, EAGLE-3.1); the residual is
hidden_norm(h) instead of h (norm_before_residual, speculators); attention is GQA
(attention.py) or DeepSeek MLA (mla.py, Eagle3DeepseekV2ForCausalLM); without
draft_vocab_size the target's lm_head scores the full vocabulary (use_target_head).

Positions (a choice that matches SGLang and SpecForge): the pair (x_{j+1}, h_j) sits at
RoPE position j, and draft step s (1-based) of a round rooted at j sits at j + s - 1.
Worked example: root j = 7, steps 1..3 -> positions [7, 8, 9].

Step 1 runs over every index of every sequence (it fills the prefix cache); steps >= 2 run
only at the drafted indices `index` [B, Q], each row its own (a replay drafts the
continuation of each sequence, not the prompts of its neighbours in the batch).
Example: prompts of 5 and 9 ids, 4 rounds each -> index [[4, 5, 6, 7], [8, 9, 10, 11]].

Attention at step s >= 2 (SGLang's draft decode, SpecForge's training-time test): the
query of row r at index j sees the step-1 keys of indices 0..j (the prefix cache) plus the
keys that row r wrote at steps 2..s at index j. Rows are beam rows (topk K); a row's
history is NOT reordered when the beam is reselected, exactly as SGLang's per-row draft
attention does (DESIGN.md §5); only the carried hidden state follows the parent.

Engine numerics (set_numerics; diag/target/engine_numerics.py says what each name rounds):
"fp32-kernels" in bf16/fp16 computes RoPE, attention and the fused add + RMSNorm as vLLM-CPU's
kernels do (float32, one rounding each); finish() then returns the float32 sum s, which
logits() normalises in float32 and carry() rounds (vLLM's hidden_prenorm).

This module knows the drafter's arithmetic. It knows nothing about files (checkpoint.py),
layouts, trees or targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from diag.drafter.attention import Attention
from diag.drafter.layers import MLP, RMSNorm
from diag.drafter.mla import MlaAttention, MlaShape
from diag.errors import DiagError
from diag.target.engine_numerics import LANES, NUMERICS, REDUCED, fp32_norm, kernel_attention


def fp32_attention(q, k, v, mask, scale: float) -> torch.Tensor:
    """vLLM-CPU's attention kernel (engine_numerics.kernel_attention) over a right-padded prefix:
    q, k, v [B, nh, T, d], mask [B, 1, T, T] (True = attend) -> [B, nh, T, d] in q's dtype."""
    T = q.shape[-2]
    out = kernel_attention(q.float() * torch.tensor(scale), [k.float()], [v.float()],
                           mask.expand(q.shape[0], q.shape[1], T, T), torch.arange(T) % LANES)
    return out.to(q.dtype)


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int            # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    num_aux: int = 3           # capture points concatenated into fc's input
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    norm_output: bool = False  # EAGLE-3.1: carry norm(r) instead of r into the next step
    attention: str = "llama"   # "llama" (GQA) | "mla" (Eagle3DeepseekV2ForCausalLM)
    mla: MlaShape | None = None
    fc_norm: bool = False      # EAGLE-3.1: RMSNorm each capture point before fc
    norm_before_fc: bool = False   # one RMSNorm over the whole concatenation before fc
    norm_before_residual: bool = False  # speculators: residual = hidden_norm(h)
    qk_norm: bool = False      # per-head q/k RMSNorm (speculators' qwen3 layer)
    lm_head_from_target: bool = False  # no draft_vocab_size: the target's lm_head scores drafts

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def fc_in(self) -> int:
        return self.num_aux * self.target_hidden_size


class MidLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MlaAttention(cfg) if cfg.attention == "mla" else Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.norm_before_residual = cfg.norm_before_residual
        self.fp32_sums = False       # set_numerics("fp32-kernels") in reduced precision

    def attn_input(self, e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(e), self.hidden_norm(h)], dim=-1)  # [..., 2H]

    def finish(self, attn_out: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """attn_out [..., nh, hv] -> r = o_proj(a) + h (hidden_norm(h) with
        norm_before_residual); r + mlp(post_norm(r))."""
        residual = self.hidden_norm(h) if self.norm_before_residual else h
        if self.fp32_sums:           # vLLM's fused_add_rms_norm: the norm of the float32 sum
            s = self.self_attn.o_proj(attn_out.flatten(-2)).float() + residual.float()
            r = s.to(residual.dtype)
            return self.mlp(fp32_norm(self.post_attention_layernorm, s, r.dtype)).float() + r.float()
        r = self.self_attn.o_proj(attn_out.flatten(-2)) + residual
        return r + self.mlp(self.post_attention_layernorm(r))


def every_index(tokens: torch.Tensor) -> torch.Tensor:
    """[B, T] -> index [B, T] = 0..T-1 in every row: draft at every index."""
    B, T = tokens.shape
    return torch.arange(T, device=tokens.device).expand(B, T)


def at_index(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, T, H] at index [B, Q] -> [B, Q, H] (row b takes x[b, index[b, q]])."""
    return x.gather(1, index[:, :, None].expand(*index.shape, x.shape[-1]))


# Deep-step scores [B, Q, R, nh, T + n] are computed in chunks of indices of at most this many
# elements (1 GiB in fp32): at Kimi's drafter widths one unchunked step asked for 32 GiB.
SCORE_ELEMENTS = 1 << 28


@dataclass
class PrefixCache:
    """Step-1 keys/values of every index, the drafter's KV cache for the prefix."""
    k: torch.Tensor      # [B, T, nh, hd]
    v: torch.Tensor      # [B, T, nh, hd]
    valid: torch.Tensor  # [B, T] bool


class Eagle3Drafter(nn.Module):
    """Weights named as SGLang/SpecForge's LlamaForCausalLMEagle3 checkpoints name them (the
    MLA drafter's attention as Eagle3DeepseekV2ForCausalLM's checkpoints name it)."""

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(cfg.fc_in, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps)
                                         for _ in range(cfg.num_aux))
        self.fc = nn.Linear(cfg.fc_in, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # lm_head_from_target: set by use_target_head (the target's [V, H] head), never saved
        self.lm_head = None if cfg.lm_head_from_target else \
            nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))
        self.embed_tokens: nn.Embedding | None = None   # set when the checkpoint carries one;
        # SGLang drafts with it only when target_hidden_size != hidden_size (draft_tables.py)
        self.fp32_math = False
        self.numerics = "transformers"           # set_numerics

    def set_numerics(self, numerics: str) -> "Eagle3Drafter":
        """Round as `numerics` does (engine_numerics.NUMERICS); only a reduced-precision GQA
        drafter changes (float32 already rounds as the engines do; MLA is not modelled)."""
        if numerics not in NUMERICS:
            raise DiagError("unknown engine numerics", field="numerics", expected=" or ".join(NUMERICS),
                            found=numerics)
        on = numerics == "fp32-kernels" and self.fc.weight.dtype in REDUCED and self.cfg.attention == "llama"
        self.numerics = numerics
        self.fp32_math = self.midlayer.fp32_sums = self.midlayer.self_attn.fp32_math = on
        return self

    # ---- vocabulary -------------------------------------------------------------------
    def set_vocab(self, hot_ids: torch.Tensor) -> None:
        """hot_ids [Vd] ascending target ids. d2t[d] = hot_ids[d] - d, so t = d + d2t[d].
        Example: hot_ids [0, 5, 9] -> d2t [0, 4, 7]; t2d true at 0, 5, 9 only."""
        hot = hot_ids.to(torch.long).to(self.d2t.device)
        self.d2t.copy_(hot - torch.arange(len(hot), device=hot.device))
        self.t2d.zero_()
        self.t2d[hot] = True

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids, -1 where the token is not in the hot vocabulary."""
        table = torch.full((self.cfg.vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
        table[self.to_target_ids(torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device))] = \
            torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device)
        return table[target_ids]

    def use_target_head(self, head: nn.Module) -> None:
        """The target's lm_head [V, H] scores the drafts (draft_vocab_size null, or absent for
        the MLA class: SGLang's load_lm_head_from_target, set_embed_and_head); held on the
        drafter's device and dtype (no copy when they already match)."""
        if not self.cfg.lm_head_from_target:
            raise ValueError("this drafter has its own lm_head")
        ref = self.fc.weight
        lin = nn.Linear(self.cfg.hidden_size, self.cfg.vocab_size, bias=False, device="meta")
        lin.weight = nn.Parameter(head.weight.detach().to(ref.device, ref.dtype), requires_grad=False)
        self.lm_head = lin

    # ---- pieces of one step -------------------------------------------------------------
    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """aux [..., k*Ht] -> h [..., H]; fc is bypassed when the widths already match
        (what SGLang does, e.g. under --speculative-algorithm EAGLE). Before fc, in SGLang's
        order: input_norm over the whole width (norm_before_fc), then each of the k chunks
        through its own fc_norm (EAGLE-3.1)."""
        if aux.shape[-1] == self.cfg.hidden_size:
            return aux
        if self.cfg.norm_before_fc:
            aux = self.input_norm(aux)
        if self.cfg.fc_norm:
            aux = torch.cat([n(c) for n, c in zip(self.fc_norm, aux.chunk(self.cfg.num_aux, dim=-1))], -1)
        return self.fc(aux)

    def logits(self, r: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            raise RuntimeError("the drafter scores with the target's lm_head: call use_target_head first")
        return self.lm_head(self.normed(r))             # [..., Vd]

    def normed(self, r: torch.Tensor) -> torch.Tensor:
        """norm(r); r a float32 sum of finish() under fp32 sums: vLLM's fused final norm."""
        if self.fp32_math and r.dtype == torch.float32:
            return fp32_norm(self.norm, r, self.fc.weight.dtype)
        return self.norm(r)

    def carry(self, r: torch.Tensor) -> torch.Tensor:
        if self.cfg.norm_output:
            return self.normed(r)
        return r.to(self.fc.weight.dtype) if self.fp32_math else r

    def prefix_step(self, e: torch.Tensor, h: torch.Tensor, valid: torch.Tensor):
        """Step 1 over whole sequences: e, h [B, T, H], valid [B, T] (right padding).
        Index j attends to indices 0..j. Returns r [B, T, H] and the PrefixCache."""
        B, T, _ = e.shape
        pos = torch.arange(T, device=e.device).expand(B, T)
        attn = self.midlayer.self_attn
        q, k, v = attn.qkv(self.midlayer.attn_input(e, h), pos)             # [B, T, nh, d]
        causal = torch.ones(T, T, dtype=torch.bool, device=e.device).tril()
        mask = causal[None, None] & valid[:, None, None, :]                  # [B, 1, T, T]
        if self.fp32_math:
            out = fp32_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, attn.scale)
        else:
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                 v.transpose(1, 2), attn_mask=mask, scale=attn.scale)
        r = self.midlayer.finish(out.transpose(1, 2), h)
        return r, PrefixCache(k, v, valid)

    def deep_step(self, e: torch.Tensor, h: torch.Tensor, step: int, cache: PrefixCache,
                  history: list[tuple[torch.Tensor, torch.Tensor]], index: torch.Tensor):
        """Step `step` >= 2 for R rows at the drafted indices index [B, Q]: e, h [B, Q, R, H].
        Row r at index j sits at position j + step - 1 and sees cache indices 0..j plus its
        own keys in `history` (steps 2..step-1), each (k, v) [B, Q, R, nh, hd].
        Returns r [B, Q, R, H] and this step's (k, v), which the caller appends to history.
        Example: index [[5, 6, 7]], step 2 -> positions [[6, 7, 8]]."""
        T = cache.k.shape[1]
        attn = self.midlayer.self_attn
        q, k, v = attn.qkv(self.midlayer.attn_input(e, h), index + step - 1)   # [B, Q, R, nh, d]
        ks = torch.stack([hk for hk, _ in history] + [k], dim=-2)          # [B, Q, R, nh, n, d]
        vs = torch.stack([hv for _, hv in history] + [v], dim=-2)
        B, Q, R, nh = q.shape[:4]
        span = max(1, SCORE_ELEMENTS // max(1, B * R * nh * (T + ks.shape[-2])))   # indices per chunk
        out = torch.cat([self._deep_attention(q[:, a:a + span], ks[:, a:a + span], vs[:, a:a + span],
                                              index[:, a:a + span], cache, attn.scale, self.fp32_math)
                         for a in range(0, Q, span)], dim=1)
        return self.midlayer.finish(out, h), (k, v)

    @staticmethod
    def _deep_attention(q, ks, vs, index, cache: PrefixCache, scale: float, fp32: bool = False) -> torch.Tensor:
        """Attention of q [B, q, R, nh, d] over the cache (indices <= index [B, q]) and each row's
        own keys ks / vs [B, q, R, nh, n, d] -> [B, q, R, nh, dv]. The scores are
        [B, q, R, nh, T + n]; deep_step passes chunks of indices so they stay under SCORE_ELEMENTS.
        fp32: vLLM-CPU's kernel (q scaled in float32, scores, softmax and P@V in float32, one rounding)."""
        T = cache.k.shape[1]
        if fp32:                     # keys in position order: the prefix 0..T-1, own keys at index+1..
            n = ks.shape[-2]
            causal = torch.arange(T, device=q.device)[None, None, :] <= index[:, :, None]
            keep = torch.cat([(causal & cache.valid[:, None, :])[:, :, None, None, None, :],
                              torch.ones(*index.shape, 1, 1, 1, n, dtype=torch.bool)], -1)
            lane = torch.cat([torch.arange(T).expand(*index.shape, T),
                              index[:, :, None] + 1 + torch.arange(n)], -1)[:, :, None, None, None] % LANES
            pre = [t.float().transpose(1, 2)[:, None, None] for t in (cache.k, cache.v)]   # [B, 1, 1, nh, T, d]
            out = kernel_attention((q.float() * torch.tensor(scale))[..., None, :], [pre[0], ks.float()],
                                   [pre[1], vs.float()], keep.expand(*q.shape[:-1], 1, T + n), lane)
            return out[..., 0, :].to(q.dtype)
        s_pre = torch.einsum("btrhd,bshd->btrhs", q, cache.k) * scale       # [B, q, R, nh, T]
        causal = torch.arange(T, device=q.device)[None, None, :] <= index[:, :, None]   # [B, q, T]
        keep = (causal & cache.valid[:, None, :])[:, :, None, None, :]
        s_pre = s_pre.masked_fill(~keep, float("-inf"))
        s_own = torch.einsum("btrhd,btrhnd->btrhn", q, ks) * scale          # [B, q, R, nh, n]
        w = torch.softmax(torch.cat([s_pre, s_own], dim=-1).float(), dim=-1).to(q.dtype)
        return torch.einsum("btrhs,bshd->btrhd", w[..., :T], cache.v) + \
            torch.einsum("btrhn,btrhnd->btrhd", w[..., T:], vs)

    # ---- a whole chain ------------------------------------------------------------------
    def head_logits(self, r: torch.Tensor, head: nn.Module | None) -> torch.Tensor:
        """Draft-vocab logits, or target-vocab logits through `head` (EAGLE mode)."""
        return self.logits(r) if head is None else head(self.normed(r))

    def ids(self, logits: torch.Tensor, head: nn.Module | None) -> torch.Tensor:
        """Greedy token as a target id (d2t applies only to the drafter's own head)."""
        best = logits.argmax(-1)
        return best if head is not None else self.to_target_ids(best)

    def unroll(self, embed_tokens: nn.Module, aux: torch.Tensor, tokens: torch.Tensor, steps: int,
               attention_mask: torch.Tensor | None = None,
               teacher_tokens: torch.Tensor | None = None, *, head: nn.Module | None = None,
               index: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Chain drafting (topk 1) at every index at once; the step loop is the only loop.
        aux [B, T, k*Ht] (or [B, T, H] in EAGLE mode); tokens [B, T] = x_{j+1} at index j;
        teacher_tokens [B, T, steps-1]: target id fed at step s+1 (None: own argmax);
        head: replaces lm_head (EAGLE mode: the target's head, target ids, no d2t);
        index [B, Q]: the indices drafted (None: every index; the prefix always fills the
        cache). Returns `steps` logits [B, Q, V]; step s predicts x_{j+1+s}."""
        valid = torch.ones_like(tokens, dtype=torch.bool) if attention_mask is None \
            else attention_mask.bool()
        index = every_index(tokens) if index is None else index
        embed = embed_tokens                     # the caller's choice (diag.engines.sglang.draft_tables)
        h = self.project(aux)
        r, cache = self.prefix_step(embed(tokens), h, valid)
        teacher = None if teacher_tokens is None else teacher_tokens.gather(
            1, index[:, :, None].expand(*index.shape, teacher_tokens.shape[-1]))
        return self.chain(embed, at_index(r, index)[:, :, None], cache, index, steps, head=head,
                          teacher_tokens=teacher)

    def chain(self, embed: nn.Module, r: torch.Tensor, cache: PrefixCache, index: torch.Tensor,
              steps: int, *, head: nn.Module | None = None,
              teacher_tokens: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The chain after step 1: r [B, Q, 1, H] is step 1's output at index [B, Q] (the
        cache holds every index); teacher_tokens [B, Q, steps-1] at those indices, or None
        (own argmax). Returns `steps` logits [B, Q, V] (see unroll)."""
        out, history = [self.head_logits(r[:, :, 0], head)], []
        for s in range(2, steps + 1):
            if teacher_tokens is not None:
                nxt = teacher_tokens[:, :, s - 2, None]                     # [B, Q, 1]
            else:
                nxt = self.ids(out[-1], head)[:, :, None]
            r, kv = self.deep_step(embed(nxt), self.carry(r), s, cache, history, index)
            history.append(kv)
            out.append(self.head_logits(r[:, :, 0], head))
        return out
