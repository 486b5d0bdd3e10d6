"""Incremental decoders for the sampler: a preallocated KV cache of our own for Llama-family models, and
Hugging Face's DynamicCache for anything else. Both keep one cache row per batch row; the sampler
drops finished rows with `select` and repeats shared prompts with it.

Written by hand because, at the sizes this product trains on CPU, the generic path spends most of a
token outside arithmetic: DynamicCache concatenates every layer's whole cache at each token (a quarter
of sampling time on the tiny policy), StaticCache attends over the full preallocated length, and the
model's forward rebuilds masks through several layers of Python per token. vLLM and SGLang do this well
on GPUs, but as servers, not as an in-process sampler returning the exact token ids and logprobs the
trainer needs. What this decoder cannot reproduce exactly (other architectures, a sliding window shorter
than the sequence) takes the Hugging Face path. peft's LoRA layers replace the projections in place, so
calling them computes what the adapted model's forward computes (base output plus the scaled adapter; no
dropout in eval mode): an adapted Llama-family model decodes here too.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

# Same block as Llama: pre-norm RMSNorm, q/k/v/o projections (optional biases), RoPE, SiLU-gated MLP.
LLAMA_FAMILY = {"llama", "mistral", "qwen2"}
# The fused CPU attention kernel behind scaled_dot_product_attention, called directly because it also returns
# each query's log-sum-exp, which merging two parts of a softmax needs. Absent from a build: plain products.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM itself: under a peft wrapper, the base model whose projections carry the adapters."""
    return model.get_base_model() if hasattr(model, "peft_config") else model


def own_decoder_fits(model: torch.nn.Module, capacity: int) -> bool:
    """Whether KVDecoder computes exactly what `model` computes, for sequences up to `capacity` tokens."""
    if hasattr(model, "peft_config") and len({p.dtype for p in model.parameters()}) > 1:
        return False  # float32 adapters on a bfloat16 base: peft casts between them inside its forward only
    model = unwrapped(model)
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or getattr(cfg, "model_type", None) not in LLAMA_FAMILY:
        return False
    if getattr(cfg, "hidden_act", None) != "silu" or not hasattr(inner, "rotary_emb"):
        return False
    window = getattr(cfg, "sliding_window", None)
    if cfg.model_type == "qwen2" and not getattr(cfg, "use_sliding_window", False):
        window = None
    return window is None or capacity <= window


def cache_arg(model: torch.nn.Module, cache: DynamicCache) -> dict[str, DynamicCache]:
    """The forward's keyword argument for a KV cache: `cache` since transformers 5.24, where the old name
    `past_key_values` warns on every call; older releases take only the old name."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft wrapper forwards kwargs
    return {"cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values": cache}


class HFDecoder:
    """The model's own forward with a DynamicCache: any causal LM, peft adapters included."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = DynamicCache()
        self.mask: torch.Tensor | None = None

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        logits = self._logits(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1)
        self.mask = mask
        self.select(rows)
        return logits[rows]

    def select(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, torch.ones((len(tok), 1), dtype=self.mask.dtype)], dim=1)
        return self._logits(input_ids=tok[:, None], attention_mask=self.mask, position_ids=pos[:, None])

    def _logits(self, **inputs: torch.Tensor | int) -> torch.Tensor:
        return self.model(**inputs, **cache_arg(self.model, self.cache), use_cache=True).logits[:, -1].float()


class KVDecoder:
    """One token per row per step through a preallocated cache: each step writes one column of keys and
    values and attends over the filled columns (a view, no copy). Rows are left-padded, so every row
    writes the same column; the mask hides each row's padding."""

    def __init__(self, model: torch.nn.Module, capacity: int):
        cfg = model.config
        self.model = model  # the prompts go through its own forward, adapters and all
        self.lm = unwrapped(model)  # the steps call the layers of the model inside
        self.capacity = capacity
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.layers = self.lm.model.layers
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.mask = torch.zeros(0)
        self.cols = 0

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The prompts through the model's own forward (exactly its numbers), their cache copied into
        the buffers, batch row j holding prompt rows[j]: only the prompt's columns are copied."""
        cache, logits = self._prompts(ids, mask, pos)
        width = ids.shape[1]
        shape = (len(rows), self.kv_heads, self.capacity, self.head_dim)
        for layer in cache.layers:
            for src, bufs in ((layer.keys, self.keys), (layer.values, self.values)):
                buf = src.new_empty(shape)
                buf[:, :, :width] = src.index_select(0, rows)
                bufs.append(buf)
        self.mask = torch.zeros((len(rows), self.capacity), dtype=torch.bool, device=ids.device)
        self.mask[:, :width] = mask.bool().index_select(0, rows)
        self.cols = width
        return logits.index_select(0, rows)

    def _prompts(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> tuple[DynamicCache, torch.Tensor]:
        """The distinct prompts through the model's own forward: their cache and last logits."""
        cache = DynamicCache()
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            **cache_arg(self.model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
        return cache, out.logits[:, -1].float()

    def select(self, index: torch.Tensor) -> None:
        # index_select, not k[index]: several times faster on these 4-d buffers.
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.mask = self.mask.index_select(0, index)

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits after feeding one token per row at position `pos`; the same arithmetic as the model's
        forward (its own norms, rotary embedding and weights), without its per-call machinery."""
        if self.cols >= self.capacity:
            raise RuntimeError(f"{type(self).__name__}: cache full at {self.cols} tokens")
        inner = self.lm.model
        h = inner.embed_tokens(tok)[:, None]  # (rows, 1, hidden)
        cos, sin = inner.rotary_emb(h, pos[:, None])
        rows = len(tok)
        for i, layer in enumerate(self.layers):
            att = layer.self_attn
            x = layer.input_layernorm(h)
            q = att.q_proj(x).view(rows, 1, self.heads, self.head_dim).transpose(1, 2)
            k = att.k_proj(x).view(rows, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            v = att.v_proj(x).view(rows, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            o = self._attend(i, q, k, v, att.scaling)  # (rows, heads, 1, head_dim)
            h = h + att.o_proj(o.transpose(1, 2).reshape(rows, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.cols += 1
        return self.lm.lm_head(inner.norm(h))[:, -1].float()

    def _attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Layer i: write this token's key and value into column `cols`, attend over the filled columns."""
        c = self.cols
        self.mask[:, c] = True  # every layer sets it; the first one counts
        self.keys[i][:, :, c : c + 1] = k
        self.values[i][:, :, c : c + 1] = v
        return F.scaled_dot_product_attention(
            q,
            self.keys[i][:, :, : c + 1],
            self.values[i][:, :, : c + 1],
            attn_mask=self.mask[:, None, None, : c + 1],
            scale=scale,
            enable_gqa=self.kv_heads != self.heads,
        )


class SharedPrefixDecoder(KVDecoder):
    """KVDecoder for batches whose rows share prompts (a GRPO group's generations): each distinct prompt's
    keys and values are kept once, and each row keeps only the tokens it generated. A step attends over
    both (one softmax, computed in the two parts and merged), reading a prompt's cache once for its whole
    group instead of once per row (what FlashInfer and vLLM call cascade attention for shared prefixes).
    Reading the cache is what bounds attention here, and the prompt is most of it early in a completion.

    The queries of a prompt's rows are laid out as one block of `group` slots, so the prompt part is a
    batched product per prompt; rows that finish leave empty slots (zeros, never read back)."""

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        cache, logits = self._prompts(ids, mask, pos)
        self.prompts = len(ids)
        counts = torch.bincount(rows, minlength=self.prompts)
        self.group = int(counts.max())
        # Each row's slot: its prompt's block, then its rank among that prompt's rows.
        order = torch.argsort(rows, stable=True)
        rank = torch.empty_like(rows)
        rank[order] = torch.arange(len(rows), device=rows.device) - (torch.cumsum(counts, 0) - counts)[rows[order]]
        self.prompt_of, self.slot = rows, rows * self.group + rank
        self.prompt_keys = [layer.keys for layer in cache.layers]  # (prompts, kv_heads, width, head_dim)
        self.prompt_values = [layer.values for layer in cache.layers]
        self.prompt_mask = mask.bool()
        own = (len(rows), self.kv_heads, self.capacity - ids.shape[1], self.head_dim)
        self.keys = [k.new_empty(own) for k in self.prompt_keys]
        self.values = [v.new_empty(own) for v in self.prompt_values]
        self.cols = ids.shape[1]
        self.width = ids.shape[1]
        return logits.index_select(0, rows)

    def select(self, index: torch.Tensor) -> None:
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.prompt_of, self.slot = self.prompt_of[index], self.slot[index]

    def _attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention over the prompt and over the row's own tokens, each normalized on its own and merged by
        their log-sum-exps (the softmax over both, computed in two parts)."""
        rows, c = len(q), self.cols - self.width
        self.keys[i][:, :, c : c + 1] = k
        self.values[i][:, :, c : c + 1] = v
        shape = (rows, self.kv_heads, self.heads // self.kv_heads, self.head_dim)  # a key head's query heads
        on_prompt = self._from_slots(self._to_slots(q.reshape(shape)) @ self.prompt_keys[i].transpose(-1, -2))
        on_prompt = (on_prompt * scale).masked_fill(~self.prompt_mask[self.prompt_of][:, None, None, :], -torch.inf)
        top = on_prompt.amax(-1, keepdim=True)
        weights = torch.exp(on_prompt - top)
        total = weights.sum(-1, keepdim=True)
        o_prompt = self._from_slots(self._to_slots(weights) @ self.prompt_values[i]) / total
        o_own, lse_own = self._own(q, self.keys[i][:, :, : c + 1], self.values[i][:, :, : c + 1], scale, shape)
        lse_prompt = top + total.log()
        lse = torch.logaddexp(lse_prompt, lse_own)
        o = o_prompt * torch.exp(lse_prompt - lse) + o_own * torch.exp(lse_own - lse)
        # The fused kernel's log-sum-exp is float32 whatever the weights: back to theirs (a bfloat16 sampler).
        return o.to(q.dtype).reshape(rows, self.heads, 1, self.head_dim)

    def _own(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, shape: tuple[int, ...]):
        """Attention over the rows' own tokens and its log-sum-exp, both in `shape` (rows, kv_heads, rep, .).
        On CPU through the fused kernel behind scaled_dot_product_attention, which returns the log-sum-exp
        too (the public function does not): 2.3x faster than the batched products on the tiny policy."""
        if _FLASH_CPU is not None and q.device.type == "cpu" and self.kv_heads == self.heads:
            o, lse = _FLASH_CPU(q, k, v, 0.0, False, scale=scale)
            return o.reshape(shape), lse.reshape(*shape[:-1], 1)
        scores = (q.reshape(shape) @ k.transpose(-1, -2)) * scale
        lse = torch.logsumexp(scores, -1, keepdim=True)
        return torch.exp(scores - lse) @ v, lse

    def _to_slots(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, kv_heads, rep, n) -> (prompts, kv_heads, group * rep, n): each prompt's rows in one block."""
        r, kvh, rep, n = x.shape
        slots = x.new_zeros(self.prompts * self.group, kvh, rep, n).index_copy_(0, self.slot, x)
        return slots.view(self.prompts, self.group, kvh, rep, n).transpose(1, 2).reshape(self.prompts, kvh, -1, n)

    def _from_slots(self, y: torch.Tensor) -> torch.Tensor:
        """The inverse of _to_slots, for the rows still in the batch."""
        p, kvh, _, n = y.shape
        y = y.view(p, kvh, self.group, -1, n).transpose(1, 2).reshape(p * self.group, kvh, -1, n)
        return y.index_select(0, self.slot)
