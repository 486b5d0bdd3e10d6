"""A domain is one folder that registers itself (envs/domains.py): the built-in ones are found by scanning envs/,
and a domain defined wholly in this file (config class, single-turn env, detector with defaults, remedy, audited
variant) is parsed from a config, run by the default suite and answered by the heuristic proposer once
registered, with no other file touched."""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar, Literal

import pytest
import yaml
from pydantic import Field

from evotrainer.config import dump_config, parse_config
from evotrainer.diagnostics.detector import Finding, Window, finding, ids
from evotrainer.diagnostics.suite import BUILTIN, Suite
from evotrainer.envs import domains
from evotrainer.envs.config import DomainConfig
from evotrainer.envs.domains import DetectorDefaults, DomainSpec
from evotrainer.envs.env import check_env
from evotrainer.envs.registry import make_domain
from evotrainer.envs.single_turn import AnswerEnv, SingleTurnDomain, prompt_text
from evotrainer.errors import ConfigError
from evotrainer.harness.harness import Harness
from evotrainer.harness.remedies import ACC, REGRADE, Remedy
from evotrainer.proposers.heuristic import HeuristicProposer
from evotrainer.proposers.proposer import Brief
from evotrainer.store.rollouts import RolloutStore
from evotrainer.types import Rollout, Task, Turn

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "piano", "lemon")


class EchoConfig(DomainConfig):
    """Say the word back: `env.domain: echo`."""

    factory: ClassVar[str] = f"{__name__}:EchoDomain"

    domain: Literal["echo"] = "echo"
    train_size: int = Field(40, ge=1)


def said(task: Task, turns: list[Turn], info: dict[str, Any]) -> float:
    """The naive grader: the word anywhere in the action. Saying every word pays."""
    return 1.0 if task.data["answer"] in turns[-1].action else 0.0


class EchoDomain(SingleTurnDomain):
    """A tiny single-turn domain: the prompt names a word, the answer is that word in its tag."""

    name = "echo"
    strict = re.compile(r"\s*<answer>(\w+)</answer>\s*")
    scorer = "exact"
    demo_recipe: dict[str, Any] = {}
    evaluator_settings: dict[str, Any] = {}
    evaluator_packages = ()

    @classmethod
    def from_config(cls, env: EchoConfig, *, seed: int, heldout_size: int) -> EchoDomain:
        return cls(seed, env.train_size, heldout_size)

    def __init__(self, seed: int, train_size: int, heldout_size: int):
        rng = random.Random(seed)
        # Held-out words are never trained on (check_env: the splits share no task).
        self._splits = {
            split: [
                Task(f"echo-{split}-{i}", split, prompt_text(f"Say {w}."), data={"answer": w})
                for i, w in enumerate(rng.choice(pool) for _ in range(n))
            ]
            for split, n, pool in (("heldout", heldout_size, WORDS[:3]), ("train", train_size, WORDS[3:]))
        }
        self.reward_terms = {"correct": self.correct, "said": said, "said_strict": self.correct}

    def tasks(self, split: str) -> list[Task]:
        return self._splits[split]

    def own_score(self, task: Task, answer: str) -> float:
        return 1.0 if answer == task.data["answer"] else 0.0

    def make_env(self) -> EchoEnv:
        return EchoEnv()


class EchoEnv(AnswerEnv):
    """The single-turn env, noting how many words the action said (what the domain's detector reads)."""

    def step(self, action: str) -> tuple[str, bool, dict[str, Any]]:
        observation, done, info = super().step(action)
        return observation, done, {**info, "echo_words": len(action.split())}


# One row per echo rollout; other domains' rollouts have no `echo_words` in their info.
_ECHO = (
    "(SELECT id, step, try_cast(try(json_extract_string(info, '$.echo_words')) AS INTEGER) AS n "
    "FROM rollouts WHERE contains(info, '\"echo_words\"'))"
)


def echo_rambling(w: Window) -> list[Finding]:
    """Actions that say many words where one was asked for: the `said` grader pays them, the audit does not."""
    p = w.params
    n, bad = w.con.execute(f"SELECT count(*), count(*) FILTER (WHERE n > ?) FROM {_ECHO}", [p["max_words"]]).fetchone()
    if not n or bad / n <= p["max_fraction"]:
        return []
    ev = ids(w, f"SELECT id FROM {_ECHO} WHERE n > ? ORDER BY step DESC, id", [p["max_words"]])
    knobs = ("reward_weights.said", "reward_weights.said_strict")
    return [finding(w, "echo_rambling", "critical", bad / n, p["max_fraction"], ev, knobs, "Rambling.", True)]


ECHO = DomainSpec(
    "echo",
    EchoConfig,
    detectors={"echo_rambling": DetectorDefaults(echo_rambling, {"max_words": 3, "max_fraction": 0.1})},
    remedies={
        "echo_rambling": (
            REGRADE,
            Remedy("set_knob", "sampling.max_completion_length", lambda h, f: 4, ACC, "up", "a word needs few tokens"),
        )
    },
    audited_variants={"said": ("said_strict",)},
)


@pytest.fixture
def echo():
    domains.register(ECHO)
    yield ECHO
    domains.unregister(ECHO.name)


def test_built_in_domains_are_found_in_their_folders():
    found = domains.registered()
    assert list(found)[:5] == ["code", "digits", "local", "math", "swe"]
    for name, spec in found.items():
        assert spec.config.__module__ == f"evotrainer.envs.{name}.config"
        assert all(d.fn.__module__.startswith(f"evotrainer.envs.{name}.") for d in spec.detectors.values())
    assert {"test_tampering", "hardcoded_examples"} <= set(BUILTIN)
    assert domains.audited_variants()["tests"] == ("tests_restored",)


def test_a_spec_must_match_its_config_and_keep_its_names():
    with pytest.raises(ValueError, match="must default to 'other'"):
        DomainSpec("other", EchoConfig)
    with pytest.raises(ValueError, match="plain identifier"):
        DomainSpec("my:echo", EchoConfig)
    clash = DomainSpec("echo", EchoConfig, detectors={"test_tampering": ECHO.detectors["echo_rambling"]})
    with pytest.raises(ValueError, match="already belong to domain 'swe'"):
        domains.register(clash)
    assert "echo" not in domains.registered()


def _rollouts(domain: EchoDomain, steps: int = 3, per_step: int = 8) -> list[Rollout]:
    """Scripted episodes through the domain's env: half answer the word, half say every word (paid by `said`)."""
    out = []
    tasks = domain.tasks("train")
    for s in range(steps):
        for i in range(per_step):
            task = tasks[(s * per_step + i) % len(tasks)]
            env = domain.make_env()
            env.reset(task)
            action = f"<answer>{task.data['answer']}</answer>" if i % 2 else " ".join(WORDS)
            _, done, info = env.step(action)
            turns = [Turn(action, len(action.split()), -0.5)]
            rewards = {name: fn(task, turns, info) for name, fn in domain.reward_terms.items()}
            out.append(
                Rollout(
                    id=f"main-s{s:06d}-{i:04d}",
                    run="r",
                    branch="main",
                    step=s,
                    harness_version="h-t",
                    task_id=task.id,
                    split="train",
                    group_id=f"main-s{s:06d}-g{i // 4:03d}",
                    prompt=task.prompt,
                    turns=turns,
                    termination="stop",
                    rewards=rewards,
                    reward=rewards["said"],
                    audit=domain.audit(task, turns, info),
                    info=info,
                )
            )
    return out


def test_a_domain_defined_here_is_parsed_diagnosed_and_remedied(tmp_path, echo):
    cfg = parse_config({"env": {"domain": "echo", "train_size": 12}, "eval": {"heldout_size": 4}})
    assert isinstance(cfg.env, EchoConfig) and cfg.env.train_size == 12
    assert parse_config(yaml.safe_load(dump_config(cfg))).env == cfg.env  # dumped as its class
    with pytest.raises(ConfigError, match=r"env\.train_size = 0"):  # its fields are checked like a built-in's
        parse_config({"env": {"domain": "echo", "train_size": 0}})
    domain = make_domain(cfg)
    check_env(domain)

    store = RolloutStore(tmp_path / "store")
    for s in range(3):
        store.append([r for r in _rollouts(domain) if r.step == s], shard=f"main-s{s:06d}")
    suite = Suite.default()
    assert "echo_rambling" in suite.detectors
    found = [f for f in suite.run(store, "main", 0, 2) if f.name == "echo_rambling"]
    assert len(found) == 1 and found[0].validity and found[0].value == 0.5

    harness = Harness(reward_weights={"said": 1.0})
    brief = Brief(
        run="r", round=1, domain="echo", harness=harness, findings=found, signature=("echo_rambling",), limit=4
    )
    offered = [p.intervention for p in HeuristicProposer().propose(brief).proposals if p.source == "catalog"]
    assert [(iv.kind, iv.target, iv.value) for iv in offered[:2]] == [
        ("replace_reward_term", "reward_weights.said", "said_strict"),  # the audited variant, first
        ("set_knob", "sampling.max_completion_length", 4),  # the domain's own remedy
    ]


def test_an_unregistered_domain_is_refused_by_name():
    assert "echo" not in domains.registered()
    with pytest.raises(ConfigError, match=r"env\.domain = 'echo': must be one of \['code', 'digits'"):
        parse_config({"env": {"domain": "echo"}})
    assert "echo_rambling" not in Suite.default().detectors
