"""The GRPO update: advantages, each loss type, masking, KL, and non-finite steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evotrainer.harness.harness import Harness
from evotrainer.harness.rewards import score
from evotrainer.policies.hf import HFPolicy, Placement
from evotrainer.training.grpo import GRPOTrainer, advantages
from evotrainer.training.rollout import run_episodes


def test_advantages_scaling():
    r = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    g = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    adv, std = advantages(r, g, "grpo", "group")
    assert abs(adv[:4].sum()) < 1e-9 and adv[0] > 0 > adv[1]
    assert np.all(adv[4:] == 0) and std[4] == 0
    none, _ = advantages(r, g, "grpo", "none")
    assert np.allclose(none[:4], [0.75, -0.25, -0.25, -0.25])
    batch, _ = advantages(r, g, "grpo", "batch")
    assert np.allclose(batch[:4], none[:4] / (r.std(ddof=1) + 1e-4))
    rloo, _ = advantages(r, g, "rloo", "none")  # baseline: the mean of the other three
    assert np.allclose(rloo[:4], [1.0, -1 / 3, -1 / 3, -1 / 3])
    # Groups need not be contiguous, and must match torch's unbiased std.
    perm = np.array([3, 6, 0, 5, 1, 7, 2, 4])
    adv_p, std_p = advantages(r[perm], g[perm], "grpo", "group")
    assert np.allclose(adv_p, adv[perm]) and np.isclose(std[0], torch.tensor(r[:4]).std().item())
    single, std1 = advantages(r, np.arange(8), "grpo", "group")  # groups of one: no signal, no NaN
    assert np.all(single == 0) and not np.isnan(single).any() and np.all(std1 == 0)


def _adv(rewards, g=8):
    adv, _ = advantages(rewards.numpy(), np.arange(len(rewards)) // g)
    return torch.tensor(adv, dtype=torch.float32)


def _batch(setup, seed=0, n_tasks=8, g=8):
    cfg, domain, policy = setup
    tasks = [t for t in domain.tasks("train")[:n_tasks] for _ in range(g)]
    eps = run_episodes(
        policy, domain, tasks, max_new_tokens=8, max_turns=1, generator=torch.Generator().manual_seed(seed)
    )
    rewards = torch.tensor([score(cfg.harness, domain, e.task, e.turns, e.info, e.termination)[1] for e in eps])
    return eps, rewards


def _seq_logp(policy, eps):
    lps = policy.logprobs([e.token_ids for e in eps])
    return torch.tensor([sum(lp[-e.action_tokens :]) for lp, e in zip(lps, eps)])


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_each_loss_type_raises_rewarded_sequences(math_setup, tmp_path, loss_type):
    cfg, domain, base = math_setup
    policy = base.fork(tmp_path / "p")
    eps, rewards = _batch((cfg, domain, policy))
    adv = _adv(rewards)
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
    adv = _adv(rewards)
    norms = {}
    for lt in ("grpo", "dr_grpo", "dapo"):
        policy = base.fork(tmp_path / lt)
        norms[lt] = GRPOTrainer(policy, Harness(loss={"loss_type": lt})).update(eps, adv, [True] * len(eps))[
            "grad_norm"
        ]
    assert len({round(v, 6) for v in norms.values()}) == 3


def test_masked_episodes_do_not_move_the_policy(math_setup, tmp_path):
    cfg, domain, base = math_setup
    policy = base.fork(tmp_path / "p")
    eps, rewards = _batch((cfg, domain, policy))
    adv = _adv(rewards)
    params = [p.detach().clone() for p in policy.model.parameters()]
    trainer = GRPOTrainer(policy, Harness())
    m = trainer.update(eps, adv, [False] * len(eps))
    assert m["tokens_trained"] == 0
    assert all(torch.equal(a, b) for a, b in zip(params, policy.model.parameters()))


def test_truncation_masking_in_a_step(math_setup, tmp_path):
    """With a 3-token cap most answers are cut; mask_truncated_completions keeps them out of the loss."""
    from evotrainer.training.segment import StepContext, train_step

    cfg, domain, base = math_setup
    ctx = StepContext("t", "main", 0)
    out = {}
    for masked in (False, True):
        policy = base.fork(tmp_path / f"p{masked}")
        h = Harness(
            sampling={"max_completion_length": 3, "num_generations": 4, "prompts_per_step": 8, "temperature": 2.0},
            loss={"mask_truncated_completions": masked},
            shaping={"length_penalty": 0.1},
        )
        out[masked] = train_step(GRPOTrainer(policy, h), domain, domain.tasks("train"), ctx, 1)
    assert out[True]["completions/clipped_ratio"] == out[False]["completions/clipped_ratio"] > 0.5
    assert out[False]["frac_trainable"] == 1.0
    assert out[True]["frac_trainable"] == 1.0 - out[True]["completions/clipped_ratio"]
    assert out[True]["tokens_trained"] < out[False]["tokens_trained"]


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
    adv = _adv(rewards)
    h = Harness(loss={"beta": 0.1, "num_iterations": 4, "epsilon": 0.05}, optimizer={"learning_rate": 1e-3})
    trainer = GRPOTrainer(policy, h)
    first = trainer.update(eps, adv, [True] * len(eps))
    second = trainer.update(eps, adv, [True] * len(eps))
    # The reference is frozen at the start: KL is 0 while the policy that sampled is the reference,
    # positive once it has moved.
    assert abs(first["kl"]) < 1e-6 and second["kl"] > 1e-4
    # Reusing a batch moves the ratio out of a narrow clip band on the later passes.
    assert first["clip_ratio/low_mean"] + first["clip_ratio/high_mean"] > 0
    no_kl = GRPOTrainer(base.fork(tmp_path / "q"), Harness()).update(eps, adv, [True] * len(eps))
    assert math.isnan(no_kl["kl"]) and no_kl["clip_ratio/low_mean"] == no_kl["clip_ratio/high_mean"] == 0


def test_checkpoint_carries_optimizer_state(math_setup, tmp_path):
    """A saved trainer checkpoint restores the AdamW moments, so a fork continues the same optimizer."""
    from evotrainer.policies.hf import HFPolicy

    cfg, domain, base = math_setup
    eps, rewards = _batch(math_setup)
    adv = _adv(rewards)
    trainer = GRPOTrainer(base.fork(tmp_path / "p"), Harness())
    trainer.update(eps, adv, [True] * len(eps))
    trainer.save(tmp_path / "ckpt")
    twin = GRPOTrainer(HFPolicy.load(tmp_path / "ckpt"), Harness())
    assert not twin.optimizer.state
    twin.load_optimizer(tmp_path / "ckpt")
    a, b = trainer.optimizer.state_dict()["state"], twin.optimizer.state_dict()["state"]
    assert a.keys() == b.keys() and all(torch.equal(a[k]["exp_avg"], b[k]["exp_avg"]) for k in a)
    # Both continue identically from the same state.
    trainer.update(eps, adv, [True] * len(eps))
    twin.update(eps, adv, [True] * len(eps))
    assert all(torch.equal(p, q) for p, q in zip(trainer.policy.model.parameters(), twin.policy.model.parameters()))


def test_a_fork_trains_with_its_own_harness_learning_rate(math_setup, tmp_path):
    """Restoring the parent's optimizer state must not restore the parent's learning rate: a branch
    whose intervention changes the learning rate trains with the new one (a bug that made every
    learning-rate trial a copy of its control)."""
    from evotrainer.policies.hf import HFPolicy

    cfg, domain, base = math_setup
    eps, rewards = _batch(math_setup)
    adv = _adv(rewards)
    parent = GRPOTrainer(base.fork(tmp_path / "p"), Harness(optimizer={"learning_rate": 1e-4}))
    parent.update(eps, adv, [True] * len(eps))
    parent.save(tmp_path / "ckpt")
    child = GRPOTrainer(
        HFPolicy.load(tmp_path / "ckpt"), Harness(optimizer={"learning_rate": 3e-4, "weight_decay": 0.05})
    )
    child.load_optimizer(tmp_path / "ckpt")
    assert {g["lr"] for g in child.optimizer.param_groups} == {3e-4}
    assert {g["weight_decay"] for g in child.optimizer.param_groups} == {0.05}
    twin = GRPOTrainer(HFPolicy.load(tmp_path / "ckpt"), Harness(optimizer={"learning_rate": 1e-4}))
    twin.load_optimizer(tmp_path / "ckpt")
    child.update(eps, adv, [True] * len(eps))
    twin.update(eps, adv, [True] * len(eps))
    assert any(not torch.equal(p, q) for p, q in zip(child.policy.model.parameters(), twin.policy.model.parameters()))


def _deltas(policy, before) -> torch.Tensor:
    return torch.cat([(p.detach() - b).flatten() for p, b in zip(policy.model.parameters(), before, strict=True)])


def test_masking_changes_which_tokens_drive_a_dapo_step_not_its_size(math_setup, tmp_path):
    """The dapo denominator counts every episode's action tokens, masked or not (as documented): masking
    episodes gives the same step as keeping them with zero advantage. With the denominator over the
    kept episodes only, masking half the batch would double the others' step."""
    eps, rewards = _batch(math_setup, seed=3)
    adv = _adv(rewards)
    masked = [i % 2 == 0 for i in range(len(eps))]
    zeroed = adv.clone()
    zeroed[[i for i, m in enumerate(masked) if not m]] = 0.0
    cfg, domain, base = math_setup
    h = Harness(loss={"loss_type": "dapo"}, optimizer={"learning_rate": 1e-3})
    steps = []
    for name, a, keep in (("mask", adv, masked), ("zero", zeroed, [True] * len(eps))):
        policy = base.fork(tmp_path / name)
        before = [p.detach().clone() for p in policy.model.parameters()]
        torch.manual_seed(0)
        GRPOTrainer(policy, h).update(eps, a, keep)
        steps.append(_deltas(policy, before))
    assert steps[0].abs().sum() > 0
    assert torch.allclose(steps[0], steps[1], atol=1e-7)


def test_the_kl_reference_is_the_run_s_base_whatever_arm_the_trainer_forks_from(math_setup, tmp_path):
    """With beta > 0 the penalty is to the initial model (TRL's meaning): a trainer forked from a trained
    arm and given the base as reference sees a KL above zero from its first step; without a reference
    it would measure against itself (zero)."""
    cfg, domain, base = math_setup
    h = Harness(loss={"beta": 0.04, "loss_type": "grpo"}, optimizer={"learning_rate": 5e-3})
    GRPOTrainer(base.fork(tmp_path / "b"), h).save(tmp_path / "base-ckpt")
    moved = base.fork(tmp_path / "moved")
    trainer = GRPOTrainer(moved, h)
    for seed in range(3):
        eps, rewards = _batch(math_setup, seed=seed)
        trainer.update(eps, _adv(rewards), [True] * len(eps))
    eps, rewards = _batch(math_setup, seed=9)
    to_self = GRPOTrainer(moved, h).update(eps, _adv(rewards), [True] * len(eps))["kl"]
    to_base = GRPOTrainer(moved, h, reference=tmp_path / "base-ckpt").update(eps, _adv(rewards), [True] * len(eps))[
        "kl"
    ]
    assert to_self == pytest.approx(0.0, abs=1e-6) and to_base > 1e-4


def test_an_entropy_bonus_is_in_the_loss_and_logged(math_setup, tmp_path):
    eps, rewards = _batch(math_setup, seed=4)
    cfg, domain, base = math_setup
    out, steps = [], []
    for coef in (0.0, 0.05):
        policy = base.fork(tmp_path / f"e{coef}")
        before = [p.detach().clone() for p in policy.model.parameters()]
        h = Harness(loss={"entropy_coef": coef}, optimizer={"learning_rate": 1e-3})
        out.append(GRPOTrainer(policy, h).update(eps, _adv(rewards), [True] * len(eps)))
        steps.append(_deltas(policy, before))
    assert math.isnan(out[0]["entropy/trained"]) and out[1]["entropy/trained"] > 0
    assert not torch.allclose(steps[0], steps[1])


def test_the_learning_rate_follows_the_schedule_by_global_step():
    from evotrainer.harness.harness import Optimizer
    from evotrainer.training.grpo import lr_factor

    o = Optimizer(learning_rate=1e-3, warmup_steps=10, lr_decay="cosine", decay_steps=110, min_lr_ratio=0.1)
    assert [round(lr_factor(o, t), 3) for t in (1, 5, 10, 60, 110, 500)] == [0.1, 0.5, 1.0, 0.55, 0.1, 0.1]
    lin = Optimizer(lr_decay="linear", decay_steps=100)
    assert lr_factor(lin, 50) == pytest.approx(0.5) and lr_factor(Optimizer(), 10_000) == 1.0
    # A decay without steps to reach its floor is refused with the fix in the message.
    with pytest.raises(ValueError, match="decay_steps"):
        Harness(optimizer={"lr_decay": "cosine", "warmup_steps": 50, "decay_steps": 20})


def _shifted(eps, which, by: float):
    """Copies of the episodes whose sampler logprobs are `by` higher on the episodes in `which`: a planted
    sampler/trainer mismatch (the sampler thought those tokens likelier than the update's forward does)."""
    from dataclasses import replace

    return [
        replace(e, sampled_logprobs=[x + by for x in e.sampled_logprobs]) if i in which else e
        for i, e in enumerate(eps)
    ]


def test_the_sampler_mismatch_is_measured_and_tis_weights_the_loss_by_it(math_setup, tmp_path):
    """In float32 our sampler and the update's forward agree (the metrics say so); a planted mismatch is
    measured as planted, and with loss.tis_cap each token's loss is weighted by p_train / p_sample: a step
    whose planted episodes the sampler overrated by 1 nat equals a step whose advantages there are e^-1 times
    smaller. Without the cap the mismatch is measured and the step ignores it."""
    eps, rewards = _batch(math_setup, seed=5)
    adv = _adv(rewards)
    cfg, domain, base = math_setup
    planted = {i for i in range(len(eps)) if i % 3 == 0 and adv[i] != 0}
    assert planted
    # The gradients are compared (Adam's first step moves every weight by about the learning rate whatever
    # the gradient's size); no clipping, so they are the loss's own.
    h = Harness(loss={"loss_type": "dapo"}, optimizer={"learning_rate": 1e-3, "max_grad_norm": 1e6})
    h_tis = Harness(
        loss={"loss_type": "dapo", "tis_cap": 2.0}, optimizer={"learning_rate": 1e-3, "max_grad_norm": 1e6}
    )

    def step(name, harness, episodes, a):
        policy = base.fork(tmp_path / name)
        m = GRPOTrainer(policy, harness).update(episodes, a, [True] * len(episodes))
        return torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]), m

    _, clean = step("clean", h, eps, adv)
    assert clean["sampling/sampling_logp_difference/mean"] < 1e-3
    assert abs(clean["sampling/importance_sampling_ratio/mean"] - 1) < 1e-3
    shifted = _shifted(eps, planted, 1.0)
    plain, m = step("plain", h, shifted, adv)
    live = [i for i in range(len(eps)) if adv[i] != 0]
    share = sum(eps[i].action_tokens for i in planted) / sum(eps[i].action_tokens for i in live)
    assert m["sampling/sampling_logp_difference/mean"] == pytest.approx(share, abs=1e-3)
    assert m["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-1), rel=1e-3)
    unplanted, _ = step("unplanted", h, eps, adv)
    assert torch.allclose(plain, unplanted, atol=1e-7), "without the cap a mismatch is only measured"
    tis, _ = step("tis", h_tis, shifted, adv)
    scaled = adv.clone()
    scaled[sorted(planted)] *= math.exp(-1)
    expected, _ = step("scaled", h, eps, scaled)
    assert not torch.allclose(tis, plain, atol=1e-6)
    assert torch.allclose(tis, expected, atol=1e-4 * float(expected.abs().max()))


def test_a_bfloat16_sampler_follows_the_trained_weights_its_mismatch_measured_and_reads_stay_exact(
    math_setup, tmp_path
):
    """policy.sample_dtype: training rollouts come from a bfloat16 copy whose weights follow the trained ones
    step by step; the update measures the copy's mismatch (TRL's sampling/* metrics, what sampling_mismatch
    reads); a held-out read (which never asks for `fast`) samples the float32 weights as a policy without it."""
    from evotrainer.training.segment import StepContext, train_step

    cfg, domain, base = math_setup
    exact = base.fork(tmp_path / "exact")
    low = HFPolicy.load(tmp_path / "exact", placement=Placement(sample_dtype="bfloat16"))
    contexts = [low.encode_prompt(domain.make_env().reset(t)) for t in domain.tasks("heldout")[:16]]

    def read(p):
        return [s.token_ids for s in p.sample(contexts, max_new_tokens=8, greedy=True)]

    assert read(low) == read(exact)
    h = Harness(sampling={"num_generations": 4, "prompts_per_step": 8}, optimizer={"learning_rate": 1e-3})
    pool = domain.tasks("train")
    m = {
        name: train_step(GRPOTrainer(p, h), domain, pool, StepContext("t", name, 0), 1)
        for name, p in [("exact", exact), ("low", low)]
    }
    key = "sampling/sampling_logp_difference/mean"
    assert m["exact"][key] < 1e-4, m["exact"][key]
    # bfloat16 keeps 8 bits of mantissa (~0.4% per operation): measured 2.8e-3 here, float32 1e-7.
    assert m["low"][key] > max(5e-4, 100 * m["exact"][key]), m
    before = [q.detach().clone() for q in low._sampler.parameters()]  # as the step sampled with them
    moved = [p.detach().to(torch.bfloat16) for p in low.model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, moved)), "the step moved no weight"
    low.sample(contexts, max_new_tokens=2, fast=True)
    assert all(q.dtype == torch.bfloat16 and torch.equal(q, w) for q, w in zip(low._sampler.parameters(), moved))
    # The two policies trained on their own rollouts (sampled at two precisions), so the read that a held-out
    # read must equal is the one of a float32 policy holding low's trained weights.
    low.save(tmp_path / "twin")
    twin = HFPolicy.load(tmp_path / "twin")
    assert read(low) == read(twin), "a held-out read does not sample the trained float32 weights"
    # Without a step between them (a multi-turn episode's turns) the copy is not made again: a weight planted in
    # the copy survives the next fast sample, and the next in-place update of the trained weights replaces it.
    first = next(q for q, p in zip(low._sampler.parameters(), low.model.parameters(), strict=True) if p.requires_grad)
    with torch.no_grad():
        first.fill_(7.0)
        low.sample(contexts, max_new_tokens=2, fast=True)
        assert bool((first == 7.0).all()), "the copy was made again though no weight moved"
        planted = [s.token_ids for s in low.sample(contexts, max_new_tokens=8, greedy=True, fast=True)]
        assert planted != read(twin), "the planted weight did not reach a fast sample"
        assert read(low) == read(twin), "a held-out read samples the copy, planted weight and all"
        next(p for p in low.model.parameters() if p.requires_grad).mul_(1.0)  # an in-place write, as a step's
        low.sample(contexts, max_new_tokens=2, fast=True)
    assert not bool((first == 7.0).all()), "the copy did not follow an in-place update"


def test_the_clip_ranges_act_only_with_more_than_one_pass_over_a_batch(math_setup, tmp_path):
    """harness/inert.py refuses a clip-range change at loss.num_iterations 1 on this claim: with one pass the ratio
    is exactly 1 and the weights come out bit-equal; with two passes the same change trains other weights."""
    cfg, domain, base = math_setup
    eps, rewards = _batch(math_setup)
    adv = _adv(rewards)
    weights = {}
    for passes in (1, 2):
        for clip in ({}, {"epsilon": 0.02, "epsilon_high": 0.03}):
            policy = base.fork(tmp_path / f"p{passes}-{len(clip)}")
            h = Harness(loss={"num_iterations": passes, **clip}, optimizer={"learning_rate": 1e-2})
            GRPOTrainer(policy, h).update(eps, adv, [True] * len(eps))
            weights[passes, bool(clip)] = [p.detach().clone() for p in policy.model.parameters()]
    before = list(base.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(weights[1, False], before)), "one pass must train"
    assert all(torch.equal(a, b) for a, b in zip(weights[1, False], weights[1, True]))
    assert any(not torch.equal(a, b) for a, b in zip(weights[2, False], weights[2, True]))
