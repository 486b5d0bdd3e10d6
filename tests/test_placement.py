"""Where a policy lives: the device is checked before a run writes anything, bfloat16 weights with float32
LoRA adapters sample and train, and gradient checkpointing changes memory, not the gradient."""

from __future__ import annotations

import pytest
import torch

from evotrainer.config import parse_config
from evotrainer.errors import ConfigError
from evotrainer.harness.harness import Harness
from evotrainer.policies.hf import HFPolicy, Placement
from evotrainer.training.grpo import GRPOTrainer
from evotrainer.training.packing import FullPack, pack_logprobs
from tests.test_grpo import _adv, _batch


def checkpointed(model: torch.nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_a_device_this_machine_lacks_stops_the_run_before_it_writes(math_setup, tmp_path):
    from evotrainer.training.run import train_run

    cfg, _, _ = math_setup
    raw = cfg.model_dump(mode="json")
    raw["run"]["out_dir"] = str(tmp_path / "runs")
    with pytest.raises(ConfigError, match="policy.device"):
        parse_config({**raw, "policy": {**raw["policy"], "device": "gpu0"}})
    if torch.cuda.device_count() > 63:
        pytest.skip("this machine has a cuda:63")
    missing = parse_config({**raw, "policy": {**raw["policy"], "device": "cuda:63"}})
    with pytest.raises(ConfigError, match=r"policy.device: cuda:63 requested but torch sees"):
        train_run(missing)
    assert not (tmp_path / "runs").exists()
    assert Placement("auto").torch_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_bfloat16_base_with_float32_adapters_samples_and_trains(math_setup, tmp_path):
    cfg, domain, policy = math_setup
    policy.save(tmp_path / "base")
    lora = HFPolicy.load(tmp_path / "base", lora_rank=4, placement=Placement("cpu", "bfloat16", True))
    dtypes = {n: p.dtype for n, p in lora.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}
    assert checkpointed(lora.model)
    eps, rewards = _batch((cfg, domain, lora))
    assert all(len(e.sampled_logprobs) == e.action_tokens > 0 for e in eps)
    adv = _adv(rewards)
    before = {n: p.detach().clone() for n, p in lora.model.named_parameters() if p.requires_grad}
    m = GRPOTrainer(lora, Harness(optimizer={"learning_rate": 1e-3})).update(eps, adv, [True] * len(eps))
    assert m["nonfinite_steps"] == 0 and m["grad_norm"] > 0
    moved = [n for n, p in lora.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert moved and all("lora_" in n for n in moved)
    twin = lora.fork(tmp_path / "fork")  # a fork keeps its placement
    assert twin.placement == lora.placement and next(twin.model.parameters()).dtype == torch.bfloat16


def test_gradient_checkpointing_gives_the_same_gradient_and_trains(math_setup, tmp_path):
    cfg, domain, policy = math_setup
    policy.save(tmp_path / "base")
    eps, rewards = _batch((cfg, domain, policy))
    weights = torch.randn(len(eps), generator=torch.Generator().manual_seed(0))
    packed = FullPack.of(eps, list(range(len(eps))), policy.pad_id)  # under checkpointing rows run whole
    grads = {}
    for gc in (False, True):
        p = HFPolicy.load(tmp_path / "base", placement=Placement(gradient_checkpointing=gc))
        assert checkpointed(p.model) == gc
        p.model.train()
        logp, _ = pack_logprobs(p.model, packed, 1.0, entropy=False)
        ((logp * packed.amask).sum(1) * weights).sum().backward()
        grads[gc] = torch.cat([w.grad.flatten() for w in p.model.parameters()])
    assert grads[False].abs().sum() > 0
    torch.testing.assert_close(grads[True], grads[False], atol=1e-7, rtol=1e-4)
    # And the trainer's update runs under it (rows whole: checkpointing drops the cache a shared prompt needs).
    p = HFPolicy.load(tmp_path / "base", placement=Placement(gradient_checkpointing=True))
    before = torch.cat([w.detach().flatten() for w in p.model.parameters()])
    m = GRPOTrainer(p, Harness(optimizer={"learning_rate": 1e-3})).update(eps, _adv(rewards), [True] * len(eps))
    assert m["nonfinite_steps"] == 0 and not torch.equal(
        torch.cat([w.detach().flatten() for w in p.model.parameters()]), before
    )
