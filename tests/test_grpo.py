"""The GRPO update: advantages, each loss type, masking, KL, and non-finite steps."""
from __future__ import annotations

import math

import pytest
import torch

from evotrainer.envs.episodes import run_episodes
from evotrainer.harness.harness import Harness
from evotrainer.harness.rewards import score
from evotrainer.training.grpo import GRPOTrainer, advantages


def test_advantages_scaling():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv, std = advantages(r, 4, "group")
    assert adv[:4].sum().abs() < 1e-6 and adv[0] > 0 > adv[1]
    assert torch.all(adv[4:] == 0) and std[1] == 0
    none, _ = advantages(r, 4, "none")
    assert torch.allclose(none[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    batch, _ = advantages(r, 4, "batch")
    assert torch.allclose(batch[:4], none[:4] / (r.std() + 1e-4))
    single, std1 = advantages(r, 1, "group")  # a group of one: no signal, and no NaN
    assert torch.all(single == 0) and not torch.isnan(single).any() and torch.all(std1 == 0)


def _batch(setup, seed=0, n_tasks=8, g=8):
    cfg, domain, policy = setup
    tasks = [t for t in domain.tasks("train")[:n_tasks] for _ in range(g)]
    eps = run_episodes(policy, domain, tasks, max_new_tokens=8, max_turns=1, generator=torch.Generator().manual_seed(seed))
    rewards = torch.tensor([score(cfg.harness, domain, e.task, e.turns, e.info, e.termination)[1] for e in eps])
    return eps, rewards


def _seq_logp(policy, eps):
    lps = policy.logprobs([e.token_ids for e in eps])
    return torch.tensor([sum(lp[-e.action_tokens:]) for lp, e in zip(lps, eps)])


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_each_loss_type_raises_rewarded_sequences(math_setup, tmp_path, loss_type):
    cfg, domain, base = math_setup
    policy = base.fork(tmp_path / "p")
    eps, rewards = _batch((cfg, domain, policy))
    adv, _ = advantages(rewards, 8, "group")
    assert (adv > 0).any() and (adv < 0).any(), "the batch needs informative groups"
    h = Harness(loss={"loss_type": loss_type}, optimizer={"learning_rate": 1e-3})
    before = _seq_logp(policy, eps)
    trainer = GRPOTrainer(policy, h)
    m = trainer.update(eps, adv, [True] * len(eps))
    delta = _seq_logp(policy, eps) - before
    assert delta[adv > 0].mean() > delta[adv < 0].mean()
    assert m["grad_norm"] > 0 and m["tokens_trained"] > 0 and m["nonfinite_steps"] == 0


def test_loss_types_differ_in_aggregation(math_setup, tmp_path):
    cfg, domain, base = math_setup
    eps, rewards = _batch(math_setup)
    adv, _ = advantages(rewards, 8, "group")
    norms = {}
    for lt in ("grpo", "dr_grpo", "dapo"):
        policy = base.fork(tmp_path / lt)
        norms[lt] = GRPOTrainer(policy, Harness(loss={"loss_type": lt})).update(eps, adv, [True] * len(eps))["grad_norm"]
    assert len({round(v, 6) for v in norms.values()}) == 3


def test_masked_episodes_do_not_move_the_policy(math_setup, tmp_path):
    cfg, domain, base = math_setup
    policy = base.fork(tmp_path / "p")
    eps, rewards = _batch((cfg, domain, policy))
    adv, _ = advantages(rewards, 8, "group")
    params = [p.detach().clone() for p in policy.model.parameters()]
    trainer = GRPOTrainer(policy, Harness())
    m = trainer.update(eps, adv, [False] * len(eps))
    assert m["tokens_trained"] == 0
    assert all(torch.equal(a, b) for a, b in zip(params, policy.model.parameters()))


def test_truncation_masking_in_a_step(math_setup, tmp_path):
    """With a 3-token cap every answer is truncated; mask_truncated_completions trains on nothing."""
    from evotrainer.training.segment import StepContext, train_step

    cfg, domain, base = math_setup
    ctx = StepContext("t", "main", 0)
    for masked in (False, True):
        policy = base.fork(tmp_path / f"p{masked}")
        h = Harness(sampling={"max_completion_length": 3, "num_generations": 4, "prompts_per_step": 8, "temperature": 2.0},
                    loss={"mask_truncated_completions": masked}, reward_weights={"correct": 1.0, "format": 0.0})
        m = train_step(GRPOTrainer(policy, h), domain, domain.tasks("train"), ctx, 1)
        assert m["completions/clipped_ratio"] == 1.0
        assert (m["tokens_trained"] == 0) == masked


def test_nonfinite_gradient_skips_the_step(math_setup, tmp_path):
    cfg, domain, base = math_setup
    policy = base.fork(tmp_path / "p")
    eps, rewards = _batch((cfg, domain, policy))
    adv = torch.full((len(eps),), float("nan"))
    params = [p.detach().clone() for p in policy.model.parameters()]
    m = GRPOTrainer(policy, Harness()).update(eps, adv, [True] * len(eps))
    assert m["nonfinite_steps"] == 1 and not math.isfinite(m["grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(params, policy.model.parameters()))


def test_kl_and_clipping_with_reuse(math_setup, tmp_path):
    cfg, domain, base = math_setup
    policy = base.fork(tmp_path / "p")
    eps, rewards = _batch((cfg, domain, policy))
    adv, _ = advantages(rewards, 8, "group")
    h = Harness(loss={"beta": 0.1, "num_iterations": 4, "epsilon": 0.05}, optimizer={"learning_rate": 3e-3})
    trainer = GRPOTrainer(policy, h)
    first = trainer.update(eps, adv, [True] * len(eps))
    second = trainer.update(eps, adv, [True] * len(eps))
    # The reference is frozen at the start: KL is 0 before the policy moves and positive after.
    assert first["kl"] >= 0 and second["kl"] > first["kl"]
    assert second["clip_ratio/low_mean"] + second["clip_ratio/high_mean"] > 0
