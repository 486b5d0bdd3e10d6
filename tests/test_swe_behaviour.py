"""Behaviour-shaped rewards of the SWE agent on real episodes: the terms, the detector that finds a behaviour failing
episodes lack, its bonus measured by replay first, and a farmable bonus (running the tests ten times) planted and
rejected by the validity side."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import train_rollout
from evotrainer.backtest.gate import invalid_reasons
from evotrainer.backtest.replay import load_columns, replay
from evotrainer.diagnostics.suite import Suite
from evotrainer.envs.swe.domain import SweDomain
from evotrainer.envs.swe.runner import run_in_process
from evotrainer.harness.harness import Harness
from evotrainer.harness.rewards import score
from evotrainer.proposers.heuristic import candidates_for
from evotrainer.store.rollouts import RolloutStore
from evotrainer.types import Task, Turn


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


def blind(task: Task) -> list[str]:
    """An edit on the right line, with the wrong text, never read first nor tested after."""
    f = task.data["fix"]
    return [f"replace {f['file']} {f['line']}     return None", "submit"]


def careful_but_wrong(task: Task) -> list[str]:
    """The careful episode's behaviour around the blind edit: read first, test after, and still wrong."""
    f = task.data["fix"]
    return [f"cat {f['file']}", *blind(task)[:1], "test", "submit"]


def mixed(step: int, i: int, task: Task) -> list[str]:
    """Groups 0-1: two careful episodes (they pass) among six blind ones. Groups 2-3: dead, every episode failing,
    two of them careful but wrong: there only a behaviour term can tell the episodes apart."""
    if i % 4:
        return blind(task)
    return careful(task) if i < 16 else careful_but_wrong(task)


FARM = ["test"] * 10 + ["submit"]


def per_test_run(task: Task, turns: list[Turn], info: dict) -> float:
    """The planted, farmable bonus: a tenth for each test run, up to 1."""
    return min(1.0, sum(t.action.startswith("test") for t in turns) / 10)


def with_planted_bonus(domain: SweDomain) -> SweDomain:
    """The domain with the planted term `test_runs` among its own, added as `env.reward_functions` adds a user's
    term (a new dict, the module's domain untouched): scored, stored and replayed like a built-in one."""
    planted = copy.copy(domain)
    planted.reward_terms = {**domain.reward_terms, "test_runs": per_test_run}
    return planted


def store_of(
    domain: SweDomain, root: Path, h: Harness, steps: int, actions: Callable[[int, int, Task], list[str]]
) -> RolloutStore:
    """`steps` steps of 4 groups of 8 real episodes, every one audited, scored under h."""
    store = RolloutStore(root)
    tasks = [t for t in domain.tasks("train") if len(t.data["failing"]) == 1]
    for step in range(steps):
        rollouts = []
        for i in range(32):
            task = tasks[(step * 4 + i // 8) % len(tasks)]
            turns, info = play(domain, task, actions(step, i, task))
            terms, total = score(h, domain, task, turns, info, "stop")
            rollouts.append(
                train_rollout(
                    "r", "main", step, i, h, task, turns, terms, total, domain.audit(task, turns, info), info
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
    store = store_of(domain, tmp_path / "s", h, 3, mixed)
    found = {f.knobs[0]: f for f in Suite.default().run(store, "main", 0, 2) if f.name == "missing_behaviour"}
    assert set(found) == {"reward_weights.search_before_edit", "reward_weights.test_after_edit"}
    for knob, weight in (("reward_weights.search_before_edit", 0.1), ("reward_weights.test_after_edit", 0.15)):
        f = found[knob]
        # Every one of the 12 passing episodes has it, 12 of the 84 failing ones (the careful but wrong) too.
        assert f.value == pytest.approx(1.0 - 12 / 84) and len(f.evidence) == 8
        assert all(int(e.rsplit("-", 1)[1]) % 4 for e in f.evidence)  # blind episodes only
        [iv] = [iv for iv in candidates_for(f, h) if iv.kind == "add_reward_term"]
        assert (iv.target, iv.value) == (knob, weight)
        # Replay first: the bonus gives the 6 dead groups (2 a step) spread, where the careful but wrong episodes
        # earn it, and its reward ranks audit passes no worse than before.
        rep = replay(h, iv.bind(h), load_columns(store, [*h.reward_weights, knob.split(".")[1]]))
        assert (rep.informative_groups_before, rep.informative_groups_after) == (6, 12) and rep.has_effect
        assert rep.reward_audit_auc_after >= rep.reward_audit_auc_before - 1e-9
    # Once the harness pays a term (training records the weights it paid as step metrics), it is no longer missing.
    store.append_metrics("r", "main", 2, {"reward_weights/test_after_edit": 0.15}, "main-s000002")
    assert {f.knobs[0] for f in Suite.default().run(store, "main", 0, 2) if f.name == "missing_behaviour"} == {
        "reward_weights.search_before_edit"
    }


def test_a_farmable_bonus_is_planted_and_rejected_by_the_validity_side(domain, tmp_path):
    """The plant: a bonus per test run, paid at 0.15. The policy learns to run the tests ten times and submit
    without a fix: the bonus climbs, the audit does not, and the arm is invalid whatever its reward."""
    h = Harness(reward_weights={"tests_restored": 1.0, "test_runs": 0.15})
    store = store_of(
        with_planted_bonus(domain),
        tmp_path / "farm",
        h,
        3,
        lambda s, i, task: FARM if i % 8 < 2 + 2 * s else ["submit"],
    )
    findings = Suite.default().run(store, "main", 0, 2)
    hacked = [f for f in findings if f.name == "reward_hacking" and f.knobs == ("reward_weights.test_runs",)]
    assert hacked and hacked[0].validity and hacked[0].severity == "critical"
    assert "validity:reward_hacking" in invalid_reasons(findings)
    # The paper's term on the same episodes: ten test runs without an edit pay nothing, so it does not rise.
    assert not any(f.name == "reward_hacking" and "test_after_edit" in f.knobs[0] for f in findings)
    assert (
        store.count("rewards['test_after_edit'] > 0 OR audit") == 0 and store.count("rewards['test_runs'] = 1") == 48
    )
