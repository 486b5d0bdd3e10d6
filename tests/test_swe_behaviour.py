"""Behaviour-shaped rewards of the SWE agent on real episodes: the terms, the detector that finds a behaviour failing
episodes lack, its bonus measured by replay first, and a farmable bonus (running the tests ten times) planted and
rejected by the validity side."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from evotrainer.backtest.gate import invalid_reasons
from evotrainer.backtest.replay import load_columns, replay
from evotrainer.diagnostics.suite import Suite
from evotrainer.envs.swe.domain import SweDomain
from evotrainer.envs.swe.runner import run_in_process
from evotrainer.harness.harness import Harness
from evotrainer.harness.rewards import score
from evotrainer.proposers.heuristic import candidates_for
from evotrainer.store.rollouts import RolloutStore
from evotrainer.types import Rollout, Task, Turn


@pytest.fixture(scope="module")
def domain() -> SweDomain:
    # Scripted episodes only (trusted code): the tests run in this process, not in a sandbox.
    return SweDomain(seed=0, levels=[0, 1, 2], train_size=120, heldout_size=20, runner=run_in_process)


def play(domain: SweDomain, task: Task, actions: list[str]) -> tuple[list[Turn], dict]:
    env = domain.make_env()
    env.reset(task)
    turns, info = [], {}
    for a in actions:
        obs, done, info = env.step(a + "\n")
        turns.append(Turn(a + "\n", 1, 0.0, obs, bool(info.get("tool_error"))))
        if done:
            break
    return turns, info


def careful(task: Task) -> list[str]:
    f = task.data["fix"]
    return [f"cat {f['file']}", f"replace {f['file']} {f['line']} {f['text']}", "test", "submit"]


def diligent(task: Task) -> list[str]:
    """Reads first and tests after, with the wrong text: the behaviour without the fix."""
    f = task.data["fix"]
    return [f"cat {f['file']}", f"replace {f['file']} {f['line']}     return None", "test", "submit"]


def blind(task: Task) -> list[str]:
    """An edit on the right line, with the wrong text, never read first nor tested after."""
    f = task.data["fix"]
    return [f"replace {f['file']} {f['line']}     return None", "submit"]


FARM = ["test"] * 10 + ["submit"]


def test_runs(task: Task, turns: list[Turn], info: dict) -> float:
    """The planted, farmable bonus: a tenth for each test run, up to 1."""
    return min(1.0, sum(t.action.startswith("test") for t in turns) / 10)


def store_of(
    domain: SweDomain, root: Path, h: Harness, steps: int, actions: Callable[[int, int, Task], list[str]]
) -> RolloutStore:
    """`steps` steps of 4 groups of 8 real episodes, every one audited, scored under h (the planted term too)."""
    store = RolloutStore(root)
    tasks = [t for t in domain.tasks("train") if len(t.data["failing"]) == 1]
    for step in range(steps):
        rollouts = []
        for i in range(32):
            task = tasks[(step * 4 + i // 8) % len(tasks)]
            turns, info = play(domain, task, actions(step, i, task))
            terms, _ = score(h, domain, task, turns, info, "stop")
            terms["test_runs"] = test_runs(task, turns, info)
            total = sum(w * terms[k] for k, w in h.reward_weights.items())
            rollouts.append(
                Rollout(
                    f"main-s{step:06d}-{i:04d}",
                    "r",
                    "main",
                    step,
                    h.version,
                    task.id,
                    "train",
                    f"main-s{step:06d}-g{i // 8:03d}",
                    task.prompt,
                    turns,
                    "stop",
                    terms,
                    total,
                    domain.audit(task, turns, info),
                    task.difficulty,
                    info,
                )
            )
        store.append(rollouts, f"main-s{step:06d}")
    return store


def test_behaviour_terms_pay_once_per_episode(domain):
    task = domain.tasks("train")[0]
    t = {name: fn for name, fn in domain.reward_terms.items() if name in ("search_before_edit", "test_after_edit")}

    def pay(actions):
        turns, info = play(domain, task, actions)
        return {k: fn(task, turns, info) for k, fn in t.items()}

    assert pay(careful(task)) == {"search_before_edit": 1.0, "test_after_edit": 1.0}
    assert pay(blind(task)) == {"search_before_edit": 0.0, "test_after_edit": 0.0}
    # Ten test runs with no edit earn neither; ten after an edit earn what one does.
    assert pay(FARM) == {"search_before_edit": 0.0, "test_after_edit": 0.0}
    assert pay([*careful(task)[:3], *["test"] * 9, "submit"])["test_after_edit"] == 1.0
    # A read after the first edit, or a test before the last, is not the behaviour.
    f = task.data["fix"]
    edit = f"replace {f['file']} {f['line']} {f['text']}"
    assert pay([edit, f"cat {f['file']}", "test", edit, "submit"]) == {
        "search_before_edit": 0.0,
        "test_after_edit": 0.0,
    }


def test_a_missing_behaviour_is_found_proposed_and_measured_by_replay(domain, tmp_path):
    h = Harness(reward_weights={"correct": 1.0, "format": 0.1})
    # Groups 0 and 2 mix careful fixes (1 in 4) with blind edits; groups 1 and 3 all fail, half of them diligently.

    def actions(step: int, i: int, task: Task) -> list[str]:
        if (i // 8) % 2 == 0:
            return careful(task) if i % 4 == 0 else blind(task)
        return diligent(task) if i % 2 == 0 else blind(task)

    store = store_of(domain, tmp_path / "s", h, 3, actions)
    found = {f.knobs[0]: f for f in Suite.default().run(store, "main", 0, 2) if f.name == "missing_behaviour"}
    assert set(found) == {"reward_weights.search_before_edit", "reward_weights.test_after_edit"}
    task = domain.tasks("train")[0]  # any task: which kind an index plays does not depend on it
    for knob, weight in (("reward_weights.search_before_edit", 0.1), ("reward_weights.test_after_edit", 0.15)):
        f = found[knob]
        # Every success has it; of the 28 failures a step, the 8 diligent ones.
        assert f.value == pytest.approx(1.0 - 8 / 28) and len(f.evidence) == 8
        assert all(actions(0, int(e.rsplit("-", 1)[1]), task) == blind(task) for e in f.evidence)
        [iv] = [iv for iv in candidates_for(f, h) if iv.kind == "add_reward_term"]
        assert (iv.target, iv.value) == (knob, weight)
        # Replay first: the bonus gives the all-failing groups spread (more rollouts carry an advantage), and its
        # reward ranks audit passes no worse than before.
        rep = replay(h, iv.bind(h), load_columns(store, [*h.reward_weights, knob.split(".")[1]]))
        assert rep.informative_groups_after > rep.informative_groups_before and rep.has_effect
        assert rep.reward_audit_auc_after >= rep.reward_audit_auc_before - 1e-9
    # Once the harness pays a term, it is no longer missing.
    store.append_metrics("r", "main", 2, {"reward_weights/test_after_edit": 0.15}, "main-s000002")
    assert {f.knobs[0] for f in Suite.default().run(store, "main", 0, 2) if f.name == "missing_behaviour"} == {
        "reward_weights.search_before_edit"
    }


def test_a_farmable_bonus_is_planted_and_rejected_by_the_validity_side(domain, tmp_path):
    """The plant: a bonus per test run, paid at 0.15. The policy learns to run the tests ten times and submit
    without a fix: the bonus climbs, the audit does not, and the arm is invalid whatever its reward."""
    h = Harness(reward_weights={"tests_restored": 1.0, "test_runs": 0.15})
    store = store_of(domain, tmp_path / "farm", h, 3, lambda s, i, task: FARM if i % 8 < 2 + 2 * s else ["submit"])
    findings = Suite.default().run(store, "main", 0, 2)
    hacked = [f for f in findings if f.name == "reward_hacking" and f.knobs == ("reward_weights.test_runs",)]
    assert hacked and hacked[0].validity and hacked[0].severity == "critical"
    assert "validity:reward_hacking" in invalid_reasons(findings)
    # The paper's term on the same episodes: ten test runs without an edit pay nothing, so it does not rise.
    assert not any(f.name == "reward_hacking" and "test_after_edit" in f.knobs[0] for f in findings)
    assert (
        store.count("rewards['test_after_edit'] > 0 OR audit") == 0 and store.count("rewards['test_runs'] = 1") == 48
    )
