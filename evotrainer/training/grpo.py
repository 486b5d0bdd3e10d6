"""GRPO-family update: group advantages, the clipped policy-gradient loss with TRL's aggregations
(grpo, dr_grpo, dapo), an optional k3 KL to a frozen reference, and a non-finite-safe optimizer step."""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import torch

from evotrainer.harness.harness import Harness, Optimizer
from evotrainer.policies.hf import HFPolicy
from evotrainer.training.optimizer import load_optimizer_state, make_optimizer, save_checkpoint
from evotrainer.training.packing import pack, pack_logprobs
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
    """The native backend. Holds the policy's optimizer and, when beta > 0, a frozen reference: the run's
    base model (`reference`, a checkpoint directory), so the KL penalty is to the initial model as in TRL,
    whichever arm the trainer forks from; without one, the policy as it is when the trainer is made."""

    def __init__(self, policy: HFPolicy, harness: Harness, reference: str | Path | None = None):
        self.policy = policy
        self.harness = harness
        self.optimizer = make_optimizer(policy, harness.optimizer)
        # The std filter's EMA threshold (filters.std_keep_ratio) after the last step this trainer ran.
        self.std_ema: float | None = None
        self.ref = None
        if harness.loss.beta > 0:
            ref = (
                HFPolicy.load(reference, placement=policy.placement).model
                if reference
                else copy.deepcopy(policy.model)
            )
            self.ref = ref.eval().requires_grad_(False)

    def save(self, path: str | Path) -> None:
        """Policy checkpoint plus optimizer state, swapped in together and on disk when this returns (a
        ledger row may point at it next; a fork copies both)."""
        save_checkpoint(self.policy, self.optimizer, path)

    def load_optimizer(self, path: str | Path) -> None:
        load_optimizer_state(self.optimizer, path)
        # load_state_dict also restores the saved param-group settings; the harness owns those
        # (a forked branch with a new learning rate must train with it, not with its parent's).
        self.set_step(None)

    def set_step(self, step: int | None) -> float:
        """The learning rate of global step `step` under the harness's schedule (warm-up, then decay),
        set on the optimizer; None: the base rate. A function of the global step, so an arm forked at
        step 41 continues the schedule where its parent was."""
        o = self.harness.optimizer
        lr = o.learning_rate * (1.0 if step is None else lr_factor(o, step))
        for g in self.optimizer.param_groups:
            g["lr"] = lr
            g["weight_decay"] = o.weight_decay
        return lr

    def update(self, episodes: list[Episode], adv: torch.Tensor, trainable: list[bool]) -> dict[str, float]:
        """One GRPO update (num_iterations optimizer steps) on a sampled batch. `trainable[i]` False
        masks episode i out of the loss (truncated or masked); it still counts in the denominators, so
        that masking does not rescale the others' gradients: a mask changes which tokens drive the step,
        not its size (TRL 1.16 leaves truncated completions out of its dapo denominator; we do not, so
        that a masking intervention stays one factor and replay sees all of its effect)."""
        h = self.harness
        L = h.loss
        t0 = time.perf_counter()
        n_seq = len(episodes)
        token_total = sum(ep.action_tokens for ep in episodes)
        # Sequences with no gradient (zero advantage, no KL and no entropy term, or masked) are left out
        # of the forward.
        extra = L.beta > 0 or L.entropy_coef > 0
        live = [i for i in range(n_seq) if trainable[i] and episodes[i].action_tokens and (adv[i] != 0 or extra)]
        batches = _microbatches(live, episodes)
        dev = self.policy.device
        # Activation checkpointing drops the cache that a shared prompt's rows continue from: rows run whole.
        share = not any(getattr(m, "gradient_checkpointing", False) for m in self.policy.model.modules())
        tensors = [pack(episodes, idx, self.policy.pad_id, share).to(dev) for idx in batches]
        adv = adv.to(dev)
        olds, refs = self._fixed_logprobs(tensors)
        stats = {"clip_low": 0.0, "clip_high": 0.0, "kl": 0.0, "tokens": 0.0, "entropy": 0.0}
        stats |= {
            "lp_diff": 0.0,
            "lp_diff_max": 0.0,
            "is_sum": 0.0,
            "is_min": math.inf,
            "is_max": 0.0,
            "is_tokens": 0.0,
        }
        grad_norms, skipped = [], 0
        for it in range(L.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for idx, packed, old, ref in zip(batches, tensors, olds, refs):
                self._backward(packed, adv[idx][:, None], old, ref, n_seq, token_total, stats, first=it == 0)
            norm, ok = self._step(bool(batches))
            grad_norms.append(norm)
            skipped += not ok
        tok = max(stats["tokens"], 1.0)
        per_pass = stats["tokens"] / L.num_iterations
        return {
            "grad_norm": grad_norms[-1] if grad_norms else 0.0,
            "clip_ratio/low_mean": stats["clip_low"] / tok,
            "clip_ratio/high_mean": stats["clip_high"] / tok,
            "kl": stats["kl"] / max(per_pass, 1.0) if L.beta > 0 else float("nan"),
            "entropy/trained": stats["entropy"] / max(per_pass, 1.0) if L.entropy_coef > 0 else float("nan"),
            "nonfinite_steps": float(skipped),
            "tokens_trained": per_pass,
            "learning_rate": self.optimizer.param_groups[0]["lr"],
            "train_seconds": time.perf_counter() - t0,
            **_mismatch_metrics(stats),
        }

    def _fixed_logprobs(self, tensors: list) -> tuple[list, list]:
        """Logprobs that do not move during the update: of the policy that sampled (for importance ratios
        when it makes several passes) and of the reference (for the KL)."""
        L, temp, model = self.harness.loss, self.harness.sampling.temperature, self.policy.model
        model.train()
        olds, refs = [None] * len(tensors), [None] * len(tensors)
        with torch.no_grad():
            if L.num_iterations > 1:
                olds = [pack_logprobs(model, packed, temp, False)[0] for packed in tensors]
            if L.beta > 0 and self.ref is not None:
                refs = [pack_logprobs(self.ref, packed, temp, False)[0] for packed in tensors]
        return olds, refs

    def _backward(self, packed, a, old, ref, n_seq: int, token_total: int, stats: dict, first: bool) -> None:
        """The loss of one microbatch, backpropagated (gradients accumulate over the batch)."""
        h, L = self.harness, self.harness.loss
        amask = packed.amask
        eps_low, eps_high = L.epsilon, L.epsilon_high if L.epsilon_high is not None else L.epsilon
        logp, entropy = pack_logprobs(self.policy.model, packed, h.sampling.temperature, L.entropy_coef > 0)
        old_lp = logp.detach() if old is None else old
        # Prompt and observation positions are zeroed before exp(), not multiplied by the mask after: an
        # infinite log-ratio or KL there would make inf * 0 = NaN in the loss or in exp()'s backward,
        # poisoning an otherwise finite step.
        ratio = torch.exp((logp - old_lp).masked_fill(~amask, 0.0))
        per_tok = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)
        m = amask.float()
        if first:  # the sampler's logprobs against the update's at the sampling weights (old_lp)
            is_w = _mismatch(old_lp, packed.sampled, amask, stats)
            if L.tis_cap is not None:
                per_tok = per_tok * is_w.clamp(max=L.tis_cap)
        if ref is not None:
            log_r = (ref - logp).masked_fill(~amask, 0.0)
            kl = torch.exp(log_r) - log_r - 1
            per_tok = per_tok + L.beta * kl
            if first:  # KL of the policy that sampled to the reference, as TRL logs it
                stats["kl"] += (kl.detach() * m).sum().item()
        if L.loss_type == "grpo":
            loss = ((per_tok * m).sum(1) / m.sum(1).clamp(min=1)).sum() / n_seq
        elif L.loss_type == "dapo":
            loss = (per_tok * m).sum() / max(token_total, 1)
        else:  # dr_grpo: a constant denominator, free of length bias
            loss = (per_tok * m).sum() / (n_seq * h.sampling.max_completion_length * h.multi_turn.max_turns)
        if entropy is not None:
            # TRL's entropy_coef: a bonus of the mean per-token entropy of the batch's trained tokens, the
            # same for every loss type (its denominator is not the loss type's).
            ent = (entropy * m).sum() / max(token_total, 1)
            loss = loss - L.entropy_coef * ent
            stats["entropy"] += (entropy.detach() * m).sum().item()
        loss.backward()
        with torch.no_grad():
            stats["clip_low"] += (((ratio < 1 - eps_low) & (a < 0)).float() * m).sum().item()
            stats["clip_high"] += (((ratio > 1 + eps_high) & (a > 0)).float() * m).sum().item()
            stats["tokens"] += m.sum().item()

    def _step(self, any_batch: bool) -> tuple[float, bool]:
        """Clip and apply the accumulated gradient; a non-finite gradient skips the step instead of
        poisoning the weights. Returns (gradient norm, whether the step was taken)."""
        params = [p for p in self.policy.model.parameters() if p.requires_grad]
        norm = (
            float(torch.nn.utils.clip_grad_norm_(params, self.harness.optimizer.max_grad_norm)) if any_batch else 0.0
        )
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return norm, False
        if any_batch:
            self.optimizer.step()
        return norm, True


def _mismatch(trained: torch.Tensor, sampled: torch.Tensor, amask: torch.Tensor, stats: dict) -> torch.Tensor:
    """Importance weights p_train / p_sample of the action tokens (1 elsewhere), their spread and the absolute
    logprob difference added to `stats` (TRL's sampling/* metrics)."""
    diff = (trained - sampled).masked_fill(~amask, 0.0)
    w = torch.exp(diff)
    if int(amask.sum()):
        stats["lp_diff"] += float(diff.abs().sum())
        stats["lp_diff_max"] = max(stats["lp_diff_max"], float(diff.abs().max()))
        stats["is_sum"] += float(w[amask].sum())
        stats["is_min"] = min(stats["is_min"], float(w[amask].min()))
        stats["is_max"] = max(stats["is_max"], float(w[amask].max()))
        stats["is_tokens"] += float(amask.sum())
    return w


def _mismatch_metrics(stats: dict) -> dict[str, float]:
    """TRL's names for the sampler/trainer mismatch of a step (nothing when no action token was trained)."""
    n = stats["is_tokens"]
    if not n:
        return {}
    return {
        "sampling/sampling_logp_difference/mean": stats["lp_diff"] / n,
        "sampling/sampling_logp_difference/max": stats["lp_diff_max"],
        "sampling/importance_sampling_ratio/min": stats["is_min"],
        "sampling/importance_sampling_ratio/mean": stats["is_sum"] / n,
        "sampling/importance_sampling_ratio/max": stats["is_max"],
    }


def lr_factor(o: Optimizer, step: int) -> float:
    """The schedule's multiplier of the base learning rate at global step `step` (1-based): linear
    warm-up over the first `warmup_steps`, then the decay (TRL's lr_scheduler_type linear / cosine,
    with a floor of min_lr_ratio) reaching its floor at `decay_steps`."""
    warm = min(1.0, step / o.warmup_steps) if o.warmup_steps else 1.0
    if o.lr_decay == "constant" or not o.decay_steps:
        return warm
    t = min(max(step - o.warmup_steps, 0) / max(o.decay_steps - o.warmup_steps, 1), 1.0)
    shape = 1.0 - t if o.lr_decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * t))
    return warm * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * shape)


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
