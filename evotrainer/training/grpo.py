"""GRPO-family update: group advantages, the clipped policy-gradient loss with TRL's aggregations
(grpo, dr_grpo, dapo), an optional k3 KL to a frozen reference, and a non-finite-safe optimizer step."""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import torch

from evotrainer.harness.harness import Harness
from evotrainer.policies.hf import HFPolicy, sequence_logprobs
from evotrainer.training.rollout import Episode

# Groups whose reward std is below this are "zero std" (an exact == 0 misses float noise).
ZERO_STD = 1e-6
TOKENS_PER_MICROBATCH = 16384


def advantages(
    total: np.ndarray, group: np.ndarray, estimator: str = "grpo", scale_rewards: str = "group", eps: float = 1e-4
) -> tuple[np.ndarray, np.ndarray]:
    """total: [N] rewards; group: [N] integer group codes (any order). Returns (advantages [N], the
    std of each rollout's group [N]). Vectorized with bincount: the replay backtest runs this on
    millions of stored rollouts."""
    total = np.asarray(total, dtype=np.float64)
    counts = np.bincount(group)
    sums = np.bincount(group, weights=total)
    mean = sums / np.maximum(counts, 1)
    dev = total - mean[group]
    # Unbiased std as torch and TRL compute it; a group of one has no spread (not NaN).
    var = np.bincount(group, weights=dev * dev) / np.maximum(counts - 1, 1)
    std = np.sqrt(var)[group]
    if estimator == "rloo":  # leave-one-out baseline: the mean of the group's other rollouts
        n = counts[group]
        adv = np.where(n > 1, (total - (sums[group] - total) / np.maximum(n - 1, 1)), 0.0)
    else:
        adv = dev
    if scale_rewards == "group":
        adv = adv / (std + eps)
    elif scale_rewards == "batch":
        adv = adv / ((total.std(ddof=1) if len(total) > 1 else 0.0) + eps)
    # Float noise in a constant group is not signal: make its advantages exactly zero.
    adv = np.where(std < 1e-12, 0.0, adv)
    return adv, std


class GRPOTrainer:
    """The native backend. Holds the policy's optimizer and, when beta > 0, a frozen reference."""

    def __init__(self, policy: HFPolicy, harness: Harness):
        self.policy = policy
        self.harness = harness
        params = [p for p in policy.model.parameters() if p.requires_grad]
        o = harness.optimizer
        self.optimizer = torch.optim.AdamW(params, lr=o.learning_rate, betas=(0.9, 0.99), weight_decay=o.weight_decay)
        self.ref = None
        if harness.loss.beta > 0:
            self.ref = copy.deepcopy(policy.model).eval().requires_grad_(False)

    def save(self, path: str | Path) -> None:
        """Policy checkpoint plus optimizer state (written last; a fork copies both)."""
        path = Path(path)
        self.policy.save(path)
        tmp = path / "optimizer.pt.tmp"
        torch.save(self.optimizer.state_dict(), tmp)
        tmp.rename(path / "optimizer.pt")

    def load_optimizer(self, path: str | Path) -> None:
        f = Path(path) / "optimizer.pt"
        if f.exists():
            self.optimizer.load_state_dict(torch.load(f, weights_only=True))
            # load_state_dict also restores the saved param-group settings; the harness owns those
            # (a forked branch with a new learning rate must train with it, not with its parent's).
            for g in self.optimizer.param_groups:
                g["lr"] = self.harness.optimizer.learning_rate
                g["weight_decay"] = self.harness.optimizer.weight_decay

    def update(self, episodes: list[Episode], adv: torch.Tensor, trainable: list[bool]) -> dict[str, float]:
        """One GRPO update (num_iterations optimizer steps) on a sampled batch. `trainable[i]` False
        masks episode i out of the loss (truncated or masked); it still counts in the denominators,
        as in TRL, so that masking does not rescale the others' gradients."""
        h = self.harness
        L = h.loss
        t0 = time.perf_counter()
        n_seq = len(episodes)
        token_total = sum(ep.action_tokens for ep, ok in zip(episodes, trainable) if ok)
        # Sequences with no gradient (zero advantage and no KL, or masked) are left out of the forward.
        live = [i for i in range(n_seq) if trainable[i] and episodes[i].action_tokens and (adv[i] != 0 or L.beta > 0)]
        batches = _microbatches(live, episodes)
        eps_low, eps_high = L.epsilon, L.epsilon_high if L.epsilon_high is not None else L.epsilon
        temp = h.sampling.temperature
        model = self.policy.model
        model.train()
        tensors = [_pack(episodes, idx, self.policy.pad_id) for idx in batches]
        olds = [None] * len(batches)
        if L.num_iterations > 1:  # importance ratios against the policy that sampled
            with torch.no_grad():
                olds = [sequence_logprobs(model, ids, mask, temp) for ids, mask, _ in tensors]
        refs = [None] * len(batches)
        if L.beta > 0 and self.ref is not None:
            with torch.no_grad():
                refs = [sequence_logprobs(self.ref, ids, mask, temp) for ids, mask, _ in tensors]
        stats = {"clip_low": 0.0, "clip_high": 0.0, "kl": 0.0, "tokens": 0.0}
        grad_norms, skipped = [], 0
        for it in range(L.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for idx, (ids, mask, amask), old, ref in zip(batches, tensors, olds, refs):
                a = adv[idx][:, None]
                logp = sequence_logprobs(model, ids, mask, temp)
                old_lp = logp.detach() if old is None else old
                # Prompt and observation positions are zeroed before exp(), not multiplied by the mask
                # after: an infinite log-ratio or KL there would make inf * 0 = NaN in the loss or in
                # exp()'s backward, poisoning an otherwise finite step.
                ratio = torch.exp((logp - old_lp).masked_fill(~amask, 0.0))
                per_tok = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)
                m = amask.float()
                if ref is not None:
                    log_r = (ref - logp).masked_fill(~amask, 0.0)
                    kl = torch.exp(log_r) - log_r - 1
                    per_tok = per_tok + L.beta * kl
                    if it == 0:  # KL of the policy that sampled to the reference, as TRL logs it
                        stats["kl"] += (kl.detach() * m).sum().item()
                if L.loss_type == "grpo":
                    loss = ((per_tok * m).sum(1) / m.sum(1).clamp(min=1)).sum() / n_seq
                elif L.loss_type == "dapo":
                    loss = (per_tok * m).sum() / max(token_total, 1)
                else:  # dr_grpo: a constant denominator, free of length bias
                    loss = (per_tok * m).sum() / (n_seq * h.sampling.max_completion_length * h.multi_turn.max_turns)
                loss.backward()
                with torch.no_grad():
                    stats["clip_low"] += (((ratio < 1 - eps_low) & (a < 0)).float() * m).sum().item()
                    stats["clip_high"] += (((ratio > 1 + eps_high) & (a > 0)).float() * m).sum().item()
                    stats["tokens"] += m.sum().item()
            params = [p for p in model.parameters() if p.requires_grad]
            norm = float(torch.nn.utils.clip_grad_norm_(params, h.optimizer.max_grad_norm)) if batches else 0.0
            grad_norms.append(norm)
            if not math.isfinite(norm):
                # A non-finite gradient skips the step instead of poisoning the weights.
                self.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            if batches:
                self.optimizer.step()
        tok = max(stats["tokens"], 1.0)
        return {
            "grad_norm": grad_norms[-1] if grad_norms else 0.0,
            "clip_ratio/low_mean": stats["clip_low"] / tok,
            "clip_ratio/high_mean": stats["clip_high"] / tok,
            "kl": stats["kl"] / (tok / L.num_iterations) if L.beta > 0 else float("nan"),
            "nonfinite_steps": float(skipped),
            "tokens_trained": stats["tokens"] / L.num_iterations,
            "train_seconds": time.perf_counter() - t0,
        }


def _microbatches(live: list[int], episodes: list[Episode]) -> list[list[int]]:
    """Group sequences of similar length (less padding) under a token budget per forward."""
    order = sorted(live, key=lambda i: len(episodes[i].token_ids))
    batches, cur, width = [], [], 0
    for i in order:
        w = max(width, len(episodes[i].token_ids))
        if cur and w * (len(cur) + 1) > TOKENS_PER_MICROBATCH:
            batches.append(cur)
            cur, w = [], len(episodes[i].token_ids)
        cur.append(i)
        width = w
    if cur:
        batches.append(cur)
    return batches


def _pack(episodes: list[Episode], idx: list[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, and the action mask aligned with logprobs ([B, T-1])."""
    width = max(len(episodes[i].token_ids) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    act = torch.zeros((len(idx), width), dtype=torch.bool)
    for r, i in enumerate(idx):
        ep = episodes[i]
        n = len(ep.token_ids)
        ids[r, :n] = torch.tensor(ep.token_ids)
        mask[r, :n] = 1
        act[r, :n] = torch.tensor(ep.is_action)
    return ids, mask, act[:, 1:]
