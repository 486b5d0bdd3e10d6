"""Rollouts packed for the update's forward passes. A GRPO group's rollouts share their prompt: `PromptPack`
runs each distinct prompt once and repeats its keys and values for the group's rows (gradients flow back
through the repeat), so the prompt's share of the update is paid once per group, not once per rollout.
`FullPack` runs every row whole: for models whose forward cannot continue from a cache with gradients
(activation checkpointing drops the cache)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from evotrainer.policies.decoders import cache_arg
from evotrainer.policies.hf import left_pad, positions
from evotrainer.training.rollout import Episode


def _prompt_length(ep: Episode) -> int:
    """Tokens before the first action (at least one: the first action's logprob needs a context)."""
    return max(1, ep.is_action.index(True) if True in ep.is_action else len(ep.token_ids))


def _right_pad(eps: list[Episode], start: list[int], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Each episode's tokens from `start` on, right-padded: ids, attention mask, action mask (at least one column)."""
    width = max(1, max(len(ep.token_ids) - s for ep, s in zip(eps, start)))
    ids = torch.full((len(eps), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(eps), width), dtype=torch.long)
    act = torch.zeros((len(eps), width), dtype=torch.bool)
    for r, (ep, s) in enumerate(zip(eps, start)):
        if n := len(ep.token_ids) - s:
            ids[r, :n] = torch.tensor(ep.token_ids[s:])
            mask[r, :n] = 1
            act[r, :n] = torch.tensor(ep.is_action[s:])
    return ids, mask, act


def _sampled(eps: list[Episode], amask: torch.Tensor) -> torch.Tensor:
    """The sampler's logprob of each action token, where `amask` marks it (0 elsewhere): scored tokens are
    exactly the action tokens, in order, so each row's marked positions take its sampled logprobs in turn."""
    out = torch.zeros(amask.shape, dtype=torch.float32)
    for r, ep in enumerate(eps):
        k = int(amask[r].sum())
        if k and len(ep.sampled_logprobs) >= k:  # an action token at position 0 has no logprob to score: skipped
            out[r][amask[r]] = torch.tensor(ep.sampled_logprobs[len(ep.sampled_logprobs) - k :], dtype=torch.float32)
    return out


@dataclass
class FullPack:
    """Whole rows, right-padded: `ids`/`mask` [B, T]; `amask` [B, T-1] marks action tokens among ids[:, 1:];
    `sampled` [B, T-1] holds the sampler's logprob of each of them (for the sampler/trainer mismatch)."""

    ids: torch.Tensor
    mask: torch.Tensor
    amask: torch.Tensor
    sampled: torch.Tensor

    @classmethod
    def of(cls, episodes: list[Episode], idx: list[int], pad_id: int) -> FullPack:
        eps = [episodes[i] for i in idx]
        ids, mask, act = _right_pad(eps, [0] * len(idx), pad_id)
        return cls(ids, mask, act[:, 1:], _sampled(eps, act[:, 1:]))

    def to(self, device: torch.device) -> FullPack:
        return type(self)(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def logits(self, model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits predicting each scored token [B, T-1, V], those tokens [B, T-1])."""
        out = model(input_ids=self.ids, attention_mask=self.mask, position_ids=positions(self.mask), use_cache=False)
        return out.logits[:, :-1], self.ids[:, 1:]


@dataclass
class PromptPack(FullPack):
    """Distinct prompts left-padded (`prompt_ids`/`prompt_mask` [U, P]), `rows` [B] naming each row's prompt,
    and each row's tokens after its prompt right-padded (`ids`/`mask`/`amask` [B, S]): every one is scored."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    rows: torch.Tensor

    @classmethod
    def of(cls, episodes: list[Episode], idx: list[int], pad_id: int) -> PromptPack:
        cut = [_prompt_length(episodes[i]) for i in idx]
        unique: dict[tuple[int, ...], int] = {}
        rows = [unique.setdefault(tuple(episodes[i].token_ids[:c]), len(unique)) for i, c in zip(idx, cut)]
        prompt_ids, prompt_mask = left_pad([list(p) for p in unique], pad_id)
        eps = [episodes[i] for i in idx]
        ids, mask, act = _right_pad(eps, cut, pad_id)
        return cls(ids, mask, act, _sampled(eps, act), prompt_ids, prompt_mask, torch.tensor(rows))

    def logits(self, model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        cache = DynamicCache()
        pos = positions(self.prompt_mask)
        head = model(
            input_ids=self.prompt_ids,
            attention_mask=self.prompt_mask,
            position_ids=pos,
            **cache_arg(model, cache),
            use_cache=True,
            logits_to_keep=1,
        ).logits
        # index_select, whose backward sums each group's gradients into its prompt in a fixed order; the
        # cache's own batch_select_indices indexes with a tensor, whose backward on CPU accumulates in
        # whatever order the threads run (runs were not bit-reproducible with it).
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.index_select(0, self.rows), layer.values.index_select(0, self.rows)
        start = pos[self.rows, -1:] + 1
        tail = model(
            input_ids=self.ids,
            attention_mask=torch.cat([self.prompt_mask[self.rows], self.mask], dim=1),
            position_ids=start + torch.arange(self.ids.shape[1], device=start.device),
            **cache_arg(model, cache),
            use_cache=True,
        ).logits
        return torch.cat([head.index_select(0, self.rows), tail[:, :-1]], dim=1), self.ids


def pack(episodes: list[Episode], idx: list[int], pad_id: int, share_prompts: bool) -> FullPack:
    return (PromptPack if share_prompts else FullPack).of(episodes, idx, pad_id)


def pack_logprobs(
    model: torch.nn.Module, packed: FullPack, temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each scored token (differentiable, aligned with `packed.amask`) and, when asked, the entropy
    of the temperature-scaled next-token distribution at each of those positions."""
    logits, target = packed.logits(model)
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
    return logp_all.gather(-1, target[..., None]).squeeze(-1), ent
