"""Policies: the contract in policy.py, Hugging Face models in hf.py, models a package ships in pretrained.py, the
embedded tiny default in tiny.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evotrainer.config import PolicySection
from evotrainer.envs.env import Domain
from evotrainer.errors import ConfigError
from evotrainer.policies.hf import POLICY_FILE, HFPolicy, Placement
from evotrainer.policies.pretrained import converted_dir, packaged_file
from evotrainer.policies.tiny import cache_root, tiny_base


def check_policy_path(p: PolicySection) -> None:
    """Policy kind hf needs a local model directory at policy.path: checked before a run directory is written."""
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
    return Placement(p.device, p.dtype, p.gradient_checkpointing, p.sample_dtype)


def check_device(p: PolicySection, executor: str) -> None:
    """A device this machine does not have stops the run before a run directory is written. Under the Ray
    executor (`loop.executor`) the arms may run on other nodes: each checks where it runs instead, when it
    loads its policy."""
    if executor != "ray":
        placement(p).torch_device()


def load_policy(
    p: PolicySection, domain: Domain, seed: int, warm_key: dict[str, Any], progress=None, log=print
) -> HFPolicy:
    """The run's starting policy: a local model directory, or the tiny default warm-started under `seed` and
    cached under `warm_key` (envs.registry.warm_start_key: what its demonstrations depend on)."""
    if p.kind == "hf":
        check_policy_path(p)
        path = converted_dir(p.pretrained, cache_root(p), log=log) if p.pretrained else p.path
        try:
            return HFPolicy.load(path, lora_rank=p.lora_rank, placement=placement(p), chat=p.chat_template)
        except FileNotFoundError as e:
            raise ConfigError(str(e)) from None
    return HFPolicy.load(
        tiny_base(p, domain, warm_key, seed, progress=progress, log=log),
        lora_rank=p.lora_rank,
        placement=placement(p),
        chat="off" if p.chat_template == "auto" else p.chat_template,
    )
