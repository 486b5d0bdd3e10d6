"""Policies: the contract in policy.py, Hugging Face models in hf.py, models a package ships in pretrained.py, the
embedded tiny default in tiny.py."""

from __future__ import annotations

from pathlib import Path

from evotrainer.config import PolicySection, RunConfig
from evotrainer.envs.env import Domain
from evotrainer.envs.registry import warm_start_key
from evotrainer.errors import ConfigError
from evotrainer.policies.hf import POLICY_FILE, HFPolicy, Placement
from evotrainer.policies.pretrained import converted_dir, packaged_file
from evotrainer.policies.tiny import cache_root, tiny_base


def check_policy_path(cfg: RunConfig) -> None:
    """Policy kind hf needs a local model directory at policy.path: checked before a run directory is written."""
    p = cfg.policy
    if p.kind != "hf":
        return
    if p.pretrained is not None:
        packaged_file(p.pretrained)  # installed, or the command that installs it
        return
    if p.path is None:
        raise ConfigError(
            "policy.path: required when policy.kind is 'hf' (a local model directory), or set policy.pretrained"
        )
    path = Path(p.path)
    if not path.is_dir():
        raise ConfigError(
            f"policy.path: {path} is not a directory; set policy.path to a local Hugging Face model directory "
            "(one holding config.json), or policy.kind to tiny"
        )
    if not (path / "config.json").exists() and not (path / POLICY_FILE).exists():
        raise ConfigError(
            f"policy.path: {path} is not a model directory (no config.json); set policy.path to a local "
            "Hugging Face model directory (one holding config.json), or policy.kind to tiny"
        )


def placement(p: PolicySection) -> Placement:
    return Placement(p.device, p.dtype, p.gradient_checkpointing)


def check_device(cfg: RunConfig) -> None:
    """A device this machine does not have stops the run before a run directory is written. Under the Ray
    executor the arms may run on other nodes: each checks where it runs instead, when it loads its policy."""
    if cfg.loop.executor != "ray":
        placement(cfg.policy).torch_device()


def load_policy(cfg: RunConfig, domain: Domain, progress=None, log=print) -> HFPolicy:
    """The run's starting policy: a local model directory, or the warm-started tiny default."""
    p = cfg.policy
    if p.kind == "hf":
        check_policy_path(cfg)
        path = converted_dir(p.pretrained, cache_root(p), log=log) if p.pretrained else p.path
        try:
            return HFPolicy.load(path, lora_rank=p.lora_rank, placement=placement(p), chat=p.chat_template)
        except FileNotFoundError as e:
            raise ConfigError(str(e)) from None
    return HFPolicy.load(
        tiny_base(p, domain, warm_start_key(cfg, domain), cfg.run.seed, progress=progress, log=log),
        lora_rank=p.lora_rank,
        placement=placement(p),
        chat="off" if p.chat_template == "auto" else p.chat_template,
    )
