"""Environments: the contract checker, the math terms and audit, the multi-turn digits env."""

from __future__ import annotations

import random

import pytest
import torch

from evotrainer.envs import registry
from evotrainer.envs.env import check_env
from evotrainer.envs.math.domain import format_reward
from evotrainer.envs.registry import make_domain
from evotrainer.errors import HarnessError
from evotrainer.harness.rewards import check_terms, score
from evotrainer.training.rollout import run_episodes
from evotrainer.types import Turn
from tests.conftest import small_config


def turn(action, obs="", err=False):
    return Turn(action=action, tokens=1, mean_logprob=0.0, observation=obs, tool_error=err)


def test_domains_pass_check_env(tmp_path):
    for domain in ("math", "digits"):
        check_env(make_domain(small_config(tmp_path, domain)))


def test_math_splits_are_disjoint_and_seeded(tmp_path):
    a = make_domain(small_config(tmp_path))
    registry._DRAWN.clear()  # drawn again, not the process's copy
    b = make_domain(small_config(tmp_path))
    assert b is not a
    assert [t.prompt for t in a.tasks("train")] == [t.prompt for t in b.tasks("train")]
    assert not {t.prompt for t in a.tasks("train")} & {t.prompt for t in a.tasks("heldout")}
    c = make_domain(small_config(tmp_path, run={"seed": 1, "name": "t", "out_dir": str(tmp_path)}))
    assert [t.prompt for t in c.tasks("heldout")] != [t.prompt for t in a.tasks("heldout")]


def test_a_drawn_domain_is_reused_by_what_it_is_drawn_from(tmp_path):
    """Every arm asks for its domain; a built-in one is drawn once a process per env section, seed and
    held-out size (a user's, or one read from a file, is built each time: tests/test_byo.py)."""
    a = make_domain(small_config(tmp_path))
    assert make_domain(small_config(tmp_path, run={"seed": 0, "name": "other", "out_dir": str(tmp_path)})) is a
    assert make_domain(small_config(tmp_path, run={"seed": 1, "name": "t", "out_dir": str(tmp_path)})) is not a
    assert make_domain(small_config(tmp_path, eval={"heldout_size": 7})) is not a
    assert make_domain(small_config(tmp_path, env={"scorer": "math_verify"})) is not a


def test_math_reward_terms_and_strict_audit(tmp_path):
    d = make_domain(small_config(tmp_path))
    task = d.tasks("train")[0]
    gold = task.data["answer"]
    right, info = [turn(f"<answer>{gold}</answer>")], {"answer": gold}
    assert d.correct(task, right, info) == 1.0 and format_reward(task, right, info) == 1.0
    assert d.audit(task, right, info)
    # The lenient reward reads the last tag; the strict audit refuses anything but one clean tag.
    messy = [turn(f"<answer>0</answer><answer>{gold}</answer>")]
    assert d.correct(task, messy, {"answer": gold}) == 1.0
    assert format_reward(task, messy, {}) == 0.0
    assert not d.audit(task, messy, {"answer": gold})
    wrong = str(int(gold) + 1)
    assert d.correct(task, [turn(f"<answer>{wrong}</answer>")], {"answer": wrong}) < 1.0
    assert d.correct(task, [turn("no tag")], {"answer": None}) == 0.0


def test_unknown_reward_term_is_refused(tmp_path):
    cfg = small_config(tmp_path, harness={"reward_weights": {"correctness": 1.0}})
    with pytest.raises(HarnessError, match="correctness"):
        check_terms(cfg.harness, make_domain(cfg))


def test_digits_env_turns_and_errors(tmp_path):
    d = make_domain(small_config(tmp_path, "digits"))
    task = d.tasks("train")[0]
    env = d.make_env()
    assert "hidden 2-digit" in env.reset(task)
    obs, done, info = env.step("ask 1\n")
    assert obs.startswith(f"digit 1 is {task.data['secret'][0]}") and not done and not info["tool_error"]
    obs, done, info = env.step("tell me\n")
    assert obs.startswith("error") and not done and info["tool_error"]
    obs, done, info = env.step("ask 9\n")
    assert info["tool_error"]
    obs, done, info = env.step(f"answer {task.data['secret']}\n")
    assert done and d.audit(task, [], info)


def test_digits_demonstrations_are_noisy(tmp_path):
    d = make_domain(small_config(tmp_path, "digits"))
    rng = random.Random(0)
    ok = errors = 0
    tasks = d.tasks("train") * 4
    for task in tasks:
        demo = d.demonstration(task, rng)
        final = demo[-1][0]
        ok += final.strip() == f"answer {task.data['secret']}"
        errors += any(text.startswith("error") for text, is_action in demo if not is_action)
    assert 0.3 < ok / len(tasks) < 0.7 and errors > 0


def test_runner_turn_cap_and_tool_error_policies(digits_setup):
    cfg, domain, policy = digits_setup
    tasks = domain.tasks("train")[:32]
    g = torch.Generator().manual_seed(0)
    capped = run_episodes(policy, domain, tasks, max_new_tokens=6, max_turns=1, generator=g)
    # One turn is never enough to ask and answer: unfinished episodes end at the cap.
    assert all(ep.termination in ("turn_cap", "stop", "length") for ep in capped)
    assert sum(ep.termination == "turn_cap" for ep in capped) > len(tasks) // 2
    assert all(len(ep.turns) == 1 for ep in capped)
    # A one-token cap cuts every command short of its newline: truncation ends the episode.
    cut = run_episodes(policy, domain, tasks, max_new_tokens=1, max_turns=4, generator=g)
    assert {ep.termination for ep in cut} == {"length"} and all(len(ep.turns) == 1 for ep in cut)
    # Feedback keeps going after an error; end / mask stop at the first one.
    fb = run_episodes(
        policy,
        domain,
        tasks,
        max_new_tokens=6,
        max_turns=5,
        tool_error="feedback",
        generator=torch.Generator().manual_seed(3),
        temperature=3.0,
    )
    assert any(any(t.tool_error for t in ep.turns[:-1]) for ep in fb)
    end = run_episodes(
        policy,
        domain,
        tasks,
        max_new_tokens=6,
        max_turns=5,
        tool_error="end",
        generator=torch.Generator().manual_seed(3),
        temperature=3.0,
    )
    assert any(ep.termination == "tool_error" for ep in end)
    for ep in end:
        assert not any(t.tool_error for t in ep.turns[:-1])
        if ep.turns[-1].tool_error and ep.termination != "length":  # truncation takes precedence
            assert ep.termination == "tool_error"
            terms, total = score(
                cfg.harness.model_copy(
                    update={"multi_turn": cfg.harness.multi_turn.model_copy(update={"tool_error": "end"})}
                ),
                domain,
                ep.task,
                ep.turns,
                ep.info,
                ep.termination,
            )
            assert total == 0.0
    # Observations are context, not actions: the action mask covers exactly the sampled tokens.
    for ep in fb:
        assert sum(ep.is_action) == sum(t.tokens for t in ep.turns) == len(ep.sampled_logprobs)


def test_math_verify_scorer_for_free_form_answers(tmp_path):
    cfg = small_config(tmp_path, env={"scorer": "math_verify"})
    d = make_domain(cfg)
    task = d.tasks("train")[0]
    gold = task.data["answer"]
    assert d.score(task, gold) == 1.0 and d.score(task, f"{gold}.0") == 1.0
    assert d.score(task, str(int(gold) + 1)) == 0.0 and d.score(task, "not a number") == 0.0
