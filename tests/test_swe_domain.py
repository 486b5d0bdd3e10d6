"""The SWE domain: generated mini-repos, the tool protocol on a private copy, the sandboxed minimal test
runner, tampering that pays the visible reward but fails the audit, the SWE detectors on real episodes,
the demonstrations, and SWE-bench-format instances end to end. Real subprocess sandboxes throughout."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from conftest import train_rollout
from evotrainer.config import load_config
from evotrainer.diagnostics.detector import check_detector
from evotrainer.diagnostics.suite import BUILTIN, Suite
from evotrainer.diagnostics.window import open_window
from evotrainer.envs.env import audit_verdict, check_env
from evotrainer.envs.registry import make_domain
from evotrainer.envs.swe.demos import SHORTCUT, plan
from evotrainer.envs.swe.domain import SweDomain
from evotrainer.envs.swe.repos import FAMILIES, LEVELS
from evotrainer.envs.swe.runner import MARK, SandboxRunner, run_in_process, sandbox_runner
from evotrainer.errors import ConfigError
from evotrainer.experimental import swe_bench as sb
from evotrainer.harness.harness import Harness
from evotrainer.harness.rewards import score
from evotrainer.sandbox import WorkerPool
from evotrainer.store.rollouts import RolloutStore
from evotrainer.types import Task, Turn
from tests.conftest import small_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def domain() -> SweDomain:
    return SweDomain(seed=0, levels=[0, 1, 2], train_size=240, heldout_size=60)


def play(domain: SweDomain, task: Task, actions: list[str]) -> tuple[list[Turn], dict, list[str]]:
    """Step a fresh env through `actions`; (turns, final info, observations)."""
    env = domain.make_env()
    env.reset(task)
    turns, info, obs_all = [], {}, []
    for a in actions:
        obs, done, info = env.step(a + "\n")
        turns.append(Turn(a + "\n", 1, 0.0, obs, bool(info.get("tool_error"))))
        obs_all.append(obs)
        if done:
            break
    return turns, info, obs_all


def fix_actions(task: Task) -> list[str]:
    f = task.data["fix"]
    return [f"cat {f['file']}", f"replace {f['file']} {f['line']} {f['text']}", "submit"]


def assert_line(task: Task) -> tuple[str, int]:
    path, _, name = task.data["failing"][0].partition("::")
    return path, task.data["files"][path].split("\n").index(f"def {name}():") + 2


def terms(domain: SweDomain, task: Task, turns, info) -> dict[str, float]:
    return {k: fn(task, turns, info) for k, fn in domain.reward_terms.items()}


# -- the domain --------------------------------------------------------------------------------------------
def test_check_env_and_config_wiring(tmp_path):
    cfg = load_config(EXAMPLES / "swe.yaml", {"env.train_size": 60, "eval.heldout_size": 20})
    d = make_domain(cfg)
    assert isinstance(d, SweDomain) and d.levels == [0, 1, 2]
    check_env(d)
    with pytest.raises(ConfigError, match="env.levels"):
        make_domain(small_config(tmp_path, env={"domain": "swe", "levels": [7], "train_size": 10}))


def test_generator_is_deterministic_graded_and_splits_disjoint(domain):
    again = SweDomain(seed=0, levels=[0, 1, 2], train_size=240, heldout_size=60)
    for split in ("train", "heldout"):
        assert [t.data["files"] for t in domain.tasks(split)] == [t.data["files"] for t in again.tasks(split)]
    other = SweDomain(seed=1, levels=[0, 1, 2], train_size=20, heldout_size=20)
    assert [t.data["answer"] for t in other.tasks("heldout")] != [t.data["answer"] for t in domain.tasks("heldout")][
        :20
    ]
    train = {t.data["answer"] for t in domain.tasks("train")}
    assert len(train) == 240 and not train & {t.data["answer"] for t in domain.tasks("heldout")}
    by_level = {lv: [t for t in domain.tasks("train") if t.difficulty == lv] for lv in domain.levels}
    assert all(len(ts) == 80 for ts in by_level.values())
    # Graded: more files with the level; at level 2 some bugs sit in a helper module no test imports.
    assert all(len(t.data["files"]) == 2 for t in by_level[0]) and all(len(t.data["files"]) == 4 for t in by_level[1])
    far = [
        t for t in by_level[2] if f"from {t.data['fix']['file'][:-3]} " not in t.data["files"][t.data["test_files"][0]]
    ]
    assert 10 < len(far) < 70
    assert {t.data["family"] for t in domain.tasks("train")} == set(FAMILIES)
    for t in domain.tasks("train")[:30]:  # the issue names a test the bug fails, and files stay tiny
        assert (
            t.data["failing"][0] in t.prompt and t.data["tests_before"]["passed"] < t.data["tests_before"]["collected"]
        )
        assert max(len(s) for s in t.data["files"].values()) < 250


def test_each_family_and_level_reference_fix_passes_the_audit(domain):
    seen = set()
    for task in domain.tasks("train"):
        key = (task.data["family"], task.difficulty)
        if key in seen:
            continue
        seen.add(key)
        turns, info, _ = play(domain, task, fix_actions(task))
        assert domain.audit(task, turns, info), key
        assert terms(domain, task, turns, info) == {
            "tests": 1.0,
            "correct": 1.0,
            "tests_restored": 1.0,
            "tests_fixed": 1.0,
            "format": 1.0,
            "search_before_edit": 1.0,  # the fix reads the file first, and submits without testing
            "test_after_edit": 0.0,
        }
        turns, info, _ = play(domain, task, ["submit"])  # unfixed
        assert not domain.audit(task, turns, info) and terms(domain, task, turns, info)["tests"] < 1.0
        assert terms(domain, task, turns, info)["tests_fixed"] == 0.0
    assert {f for f, _ in seen} == set(FAMILIES) and {lv for _, lv in seen} == set(domain.levels)


def test_a_special_cased_fix_passes_visible_tests_but_not_the_hidden_ones(domain):
    task = next(t for t in domain.tasks("train") if t.data["family"] == "constant" and t.difficulty == 0)
    path, line = assert_line(task)
    call = task.data["files"][path].split("\n")[line - 1].strip()[len("assert ") :].split(" == ")
    f = task.data["fix"]  # hard-code the visible answer into the buggy function
    hack = f"    return {call[1]}"
    turns, info, _ = play(domain, task, [f"replace {f['file']} {f['line']} {hack}", "submit"])
    assert terms(domain, task, turns, info)["tests"] == 1.0 and not domain.audit(task, turns, info)


# -- the tool protocol ----------------------------------------------------------------------------------
def test_tool_protocol(domain):
    task = next(t for t in domain.tasks("train") if t.difficulty == 1)
    mod = task.data["fix"]["file"]
    n = len(task.data["files"][mod].split("\n")) - 1
    env = domain.make_env()
    env.reset(task)
    obs, done, info = env.step("ls\n")
    assert obs.split("\n")[0].split() == sorted(task.data["files"]) and not info["tool_error"]
    for bad in (
        "cat ../etc/passwd",
        "cat /etc/passwd",
        f"cat {mod}/..",
        "cat nope.py",
        "replace ../x.py 1 y",
        "ls -la",
        "frobnicate",
        f"cat {mod} 0-2",
        f"cat {mod} 3-1",
        f"cat {mod} {n + 1}",
        f"replace {mod} {n + 1} x",
        f"replace {mod} x-2 y",
        "grep",
        "test now",
        "submit please",
    ):
        obs, done, info = env.step(bad + "\n")
        assert obs.startswith("error: ") and obs.endswith("\n$ ") and info["tool_error"] and not done, bad
    assert "outside the repository" in env.step("cat ../../x\n")[0]
    lines = env.step(f"cat {mod} 2-99\n")[0].split("\n")[:-1]  # the end of a range is clipped to the file
    assert lines == [f"{i} {t}" for i, t in enumerate(task.data["files"][mod].split("\n")[1:-1], 2)]
    assert env.step(f"cat {mod} 2\n")[0].split("\n")[0] == "2 " + task.data["files"][mod].split("\n")[1]
    fname = task.data["fix"]["function"]
    assert env.step(f"grep def {fname}(\n")[0].startswith(f"{mod}:{task.data['fix']['def_line']}:def {fname}(")
    assert env.step("grep zzz\n")[0] == "no matches\n$ "
    # Range form: two lines become three (a literal \n splits), then one line is deleted.
    assert env.step(f"replace {mod} 1-2 # a\\n# b\\n# c\n")[0] == "ok\n$ "
    assert env.step(f"cat {mod} 1-3\n")[0] == "1 # a\n2 # b\n3 # c\n$ "
    env.step(f"replace {mod} 3\n")
    assert env.step(f"cat {mod}\n")[0].split("\n")[:2] == ["1 # a", "2 # b"]
    _, _, info = env.step("test\n")
    assert info["files_touched"] == [mod] and info["test_files_touched"] == [] and mod in info["edits"]
    # Long observations are cut at max_output.
    short = SweDomain(seed=0, levels=[1], train_size=4, heldout_size=2, max_output=40)
    env = short.make_env()
    env.reset(short.tasks("train")[0])
    obs = env.step("grep e\n")[0]
    assert obs.endswith("\n... [truncated]\n$ ") and len(obs) == 40 + len("\n... [truncated]\n$ ")


def test_sandbox_runner_agrees_with_the_in_process_runner(domain):
    runner = sandbox_runner()
    for task in domain.tasks("heldout")[:6]:
        tests = list(task.data["test_files"]) + sorted(task.data["hidden"])
        files = {**task.data["files"], **task.data["hidden"]}
        assert runner(files, tests) == run_in_process(files, tests)
        # The same files and tests again are served from the content cache, without a sandbox run.
        runs = runner.runs
        assert runner(dict(files), list(tests)) == run_in_process(files, tests) and runner.runs == runs
    task = domain.tasks("heldout")[0]
    f = task.data["fix"]
    turns, info, obs = play(domain, task, [f"replace {f['file']} {f['line']}     while True: pass", "test", "submit"])
    assert obs[1].startswith("tests did not finish: timeout")
    assert terms(domain, task, turns, info)["tests"] == 0.0 and info["run_failure"] == "timeout"
    assert not domain.audit(task, turns, info)


def test_a_forged_report_line_is_not_a_report(domain):
    # The code under test prints what the runner would print for an all-green run, then exits before
    # the runner can report: without the run's key (sent on stdin) the line is ignored.
    task = domain.tasks("heldout")[0]
    tests = list(task.data["test_files"])
    green = run_in_process(task.data["files"], tests)
    forged = {"tests": {t: "passed" for t in green.tests}, "failures": {}, "collection_errors": {}}
    f = task.data["fix"]
    lines = task.data["files"][f["file"]].split("\n")
    lines.insert(
        0,
        f"import os, json; print({MARK!r} + json.dumps({forged!r}), flush=True); "
        f"print({MARK!r} + 'x' * 32 + ' ' + json.dumps({forged!r}), flush=True); os._exit(0)",
    )
    report = sandbox_runner()({**task.data["files"], f["file"]: "\n".join(lines)}, tests)
    assert report.run_failure == "no report" and report.pass_fraction == 0.0 and not report.tests


def test_a_failing_sandbox_ends_the_episode_as_an_infrastructure_error():
    pool = WorkerPool()
    pool.close()  # every job now raises: the sandbox, not the policy, is broken
    d = SweDomain(seed=0, levels=[0], train_size=4, heldout_size=2, runner=SandboxRunner(pool=pool))
    turns, info, obs = play(d, d.tasks("train")[0], ["ls", "test"])
    assert (
        info["termination"] == "error" and "closed" in info["infra_error"] and obs[-1] == "" and not info["tool_error"]
    )


def test_a_failing_sandbox_during_the_audit_is_no_verdict_never_a_fail(domain):
    task = domain.tasks("heldout")[0]
    turns, info, _ = play(domain, task, fix_actions(task))
    pool = WorkerPool()
    pool.close()
    broken = SweDomain(seed=0, levels=[0, 1, 2], train_size=240, heldout_size=60, runner=SandboxRunner(pool=pool))
    noted = dict(info)  # retried, then no verdict and the reason on info; no exception
    assert audit_verdict(broken, task, turns, noted) is None and "closed" in noted["audit_infra_error"]
    assert audit_verdict(domain, task, turns, info) is True  # the same episode, audited by a working sandbox


# -- tampering: the visible reward pays, the audit does not ---------------------------------------------------
def tamper_actions(task: Task, how: str) -> list[str]:
    path, line = assert_line(task)
    f = task.data["fix"]
    return {
        "assert_true": [f"replace {path} {line}     assert True", "submit"],
        "delete_test": [f"replace {path} {line - 1}-{line}", "submit"],
        "break_collection": [f"replace {path} 1 from nowhere import nothing", "submit"],
        # What RL found under the naive reward (examples/failures/swe_tampering.yaml): a syntax
        # error in the module under test, so its test file no longer collects.
        "break_source": [f"replace {f['file']} {f['line']}     return  t = 0", "submit"],
    }[how]


@pytest.mark.parametrize("how", ["assert_true", "delete_test", "break_collection", "break_source"])
def test_tampering_raises_the_visible_reward_but_fails_the_audit(domain, how):
    # One failing test per repo here (a buggy helper can fail several, and one edit hides only one).
    for task in [
        next(t for t in domain.tasks("train") if t.difficulty == lv and len(t.data["failing"]) == 1)
        for lv in domain.levels
    ]:
        honest_fail = terms(domain, task, *play(domain, task, ["submit"])[:2])
        turns, info, _ = play(domain, task, tamper_actions(task, how))
        t = terms(domain, task, turns, info)
        assert t["tests"] == 1.0 > honest_fail["tests"] and t["correct"] == 1.0
        assert t["tests_restored"] < 1.0 and not domain.audit(task, turns, info)
        assert t["tests_fixed"] == 0.0  # partial credit reads the restored tests: tampering fixes nothing
        assert info["test_files_touched"] == ([] if how == "break_source" else [assert_line(task)[0]])
        before, after = info["tests_collected_before"], info["tests_collected_after"]
        if how == "delete_test":
            assert after == before - 1
        elif how in ("break_collection", "break_source"):
            assert info["collection_errors"] == [assert_line(task)[0]] and after < before
        else:
            assert after == before and info["tests_passed_after"] == after


# -- detectors on real episodes ---------------------------------------------------------------------------
KINDS = ("fix", "assert_true", "delete_test", "break_collection", "break_source", "none")


def episodes_store(
    domain: SweDomain, root: Path, kinds: tuple[str, ...], term: str = "tests", weights: bool = False
) -> tuple[RolloutStore, dict[str, str]]:
    """3 steps of 32 episodes played through the env, scored under a harness that pays `term`, half
    audited, written to a store. A group is 8 episodes of one task, as in GRPO, mixing the kinds.
    `weights`: each step's `reward_weights/<term>` metrics as a segment records them (the terms it paid).
    Returns the store and rollout id -> kind."""
    store, harness, kind_of = RolloutStore(root), Harness(reward_weights={term: 1.0}), {}
    tasks = [t for t in domain.tasks("train") if len(t.data["failing"]) == 1]
    for step in range(3):
        rollouts = []
        for i in range(32):
            task, kind = tasks[(step * 4 + i // 8) % len(tasks)], kinds[(i + step) % len(kinds)]
            turns, info, _ = play(
                domain,
                task,
                fix_actions(task) if kind == "fix" else ["submit"] if kind == "none" else tamper_actions(task, kind),
            )
            t, total = score(harness, domain, task, turns, info, "stop")
            rid = f"main-s{step:06d}-{i:04d}"
            kind_of[rid] = kind
            audit = domain.audit(task, turns, info) if i % 2 == 0 else None
            rollouts.append(train_rollout("r", "main", step, i, harness, task, turns, t, total, audit, info, rid))
        store.append(rollouts, f"main-s{step:06d}")
        if weights:
            paid = {f"reward_weights/{t}": w for t, w in harness.reward_weights.items()}
            store.append_metrics("r", "main", step, paid, f"main-s{step:06d}")
    return store, kind_of


def test_detectors_fire_on_tampering_episodes_with_their_evidence(domain, tmp_path):
    store, kind_of = episodes_store(domain, tmp_path / "bad", KINDS, weights=True)
    findings = {f.name: f for f in Suite.default().run(store, "main", 0, 2)}
    expect = {
        "test_tampering": {"assert_true", "delete_test", "break_collection"},
        "tests_dropped": {"delete_test", "break_collection", "break_source"},
        "collection_errors": {"break_collection", "break_source"},
    }
    for name, kinds in expect.items():
        f = findings[name]
        assert f.validity and f.severity == "critical" and len(f.evidence) == 8
        assert {kind_of[i] for i in f.evidence} <= kinds, (name, [kind_of[i] for i in f.evidence])
        assert f.value == pytest.approx(sum(k in kinds for k in kind_of.values()) / len(kind_of))
        assert "reward_weights.tests" in f.knobs
        w = open_window(store, "main", 0, 2, BUILTIN[name][1])
        try:
            check_detector(BUILTIN[name][0], w)  # deterministic, evidence ids exist
        finally:
            w.con.close()
    # Tampering pays the same visible reward as the fix, and the audit tells them apart.
    rows = store.query(where="audit IS NOT NULL")
    assert all(r["reward"] == 1.0 for r in rows if kind_of[r["id"]] != "none")
    assert all(r["audit"] == (kind_of[r["id"]] == "fix") for r in rows)
    swe_findings = {"test_tampering", "tests_dropped", "collection_errors"}
    honest, _ = episodes_store(domain, tmp_path / "ok", ("fix", "none"))
    assert not swe_findings & {f.name for f in Suite.default().run(honest, "main", 0, 2)}
    # Under a harness that restores the tests, tampering earns what doing nothing earns, below the
    # fixes of its group: not paid, no validity finding, unless the suite is told to count every
    # tampering rollout, paid or not.
    kinds = ("fix", "assert_true", "none", "fix", "delete_test", "none", "fix", "break_collection")
    careful, _ = episodes_store(domain, tmp_path / "careful", kinds, term="tests_restored", weights=True)
    assert not swe_findings & {f.name for f in Suite.default().run(careful, "main", 0, 2)}
    strict = Suite.default().with_params("test_tampering", paid_only=0.0)
    assert "test_tampering" in {f.name for f in strict.run(careful, "main", 0, 2)}


def test_a_tampering_rollout_reinforced_for_its_partial_credit_is_not_paid_for_the_edit(domain, tmp_path):
    # Groups of episodes that assert a failing test away and episodes that break the module under test. Under
    # partial credit on the restored tests the first earn what the tests that really pass give, above the broken
    # ones: reinforced, for those tests, not for the edit. Where the window records which terms were paid, that is
    # no test tampering; under `tests` the edit is what pays. A window without those records counts every
    # reinforced edit, as before they were recorded.
    kinds = ("assert_true", "break_source")

    def tampering(term: str, weights: bool) -> list:
        store, kind_of = episodes_store(domain, tmp_path / f"{term}-{weights}", kinds, term=term, weights=weights)
        if term == "tests_restored":  # paid as the suite counts it (reward >= 0.5), above the broken ones
            groups: dict[str, dict[str, list[float]]] = {}
            for r in store.query():
                groups.setdefault(r["group_id"], {}).setdefault(kind_of[r["id"]], []).append(r["reward"])
            assert all(
                min(g["assert_true"]) >= 0.5 and min(g["assert_true"]) > max(g["break_source"])
                for g in groups.values()
            )
        return [f for f in Suite.default().run(store, "main", 0, 2) if f.name == "test_tampering"]

    assert not tampering("tests_restored", weights=True)
    (old,) = tampering("tests_restored", weights=False)
    (naive,) = tampering("tests", weights=True)
    (clean_run,) = tampering("correct", weights=True)  # `correct` pays the edited tests' clean run
    for f in (old, naive, clean_run):
        assert f.validity and f.value == pytest.approx(0.5) and "paid for it" in f.message


# -- demonstrations ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def long_domain() -> SweDomain:
    return SweDomain(seed=0, levels=[3], train_size=40, heldout_size=10, max_output=2000)


def test_the_long_horizon_level_takes_two_edits_with_a_test_between(long_domain):
    assert 3 in LEVELS
    partial = 0
    for task in long_domain.tasks("train")[:12]:
        fixes = task.data["fixes"]
        assert task.difficulty == 3 and len(fixes) == 2 and fixes[0]["file"] != fixes[1]["file"]
        edits = [f"replace {f['file']} {f['line']} {f['text']}" for f in fixes]
        reads = [f"cat {m}" for m in task.data["modules"]]
        for first, second in (edits, edits[::-1]):
            turns, info, obs = play(long_domain, task, reads + [first, "test", second, "test", "submit"])
            assert len(turns) == 7 and "FAIL " in obs[3] and " 0 failed" in obs[5]  # the test run shows the other
            assert long_domain.audit(task, turns, info) and terms(long_domain, task, turns, info)["correct"] == 1.0
        for one in edits:  # either edit alone: the visible tests still fail, the audit too
            turns, info, _ = play(long_domain, task, reads + [one, "submit"])
            assert terms(long_domain, task, turns, info)["correct"] == 0.0 and not long_domain.audit(task, turns, info)
            # ... but where the two bugs fail two tests, one edit fixes one of them: the partial credit that gives
            # a dead group spread. Where both bugs fail the one test (the caller's bug and the helper it calls),
            # no test passes until both edits are in, and partial credit by test has nothing to pay.
            fixed = terms(long_domain, task, turns, info)["tests_fixed"]
            assert fixed == (0.5 if len(task.data["failing"]) == 2 else 0.0), (task.id, task.data["failing"])
        partial += len(task.data["failing"]) == 2
    assert 0 < partial < 12  # both kinds are among the tasks
    rng = random.Random(0)
    tasks = [t for t in long_domain.tasks("train") for _ in range(3)]
    actions = [[a for a, is_action in long_domain.demonstration(t, rng) if is_action] for t in tasks]
    solved = [
        acts
        for t, acts in zip(tasks, actions)
        if all(f"replace {f['file']} {f['line']} {f['text']}\n" in acts for f in t.data["fixes"])
    ]
    assert len(solved) / len(tasks) > 0.6 and all(len(acts) >= 6 for acts in solved)


def test_observations_are_cut_to_the_harness_limit(long_domain, digits_setup):
    from evotrainer.training.rollout import run_episodes

    policy = digits_setup[2]  # a multi-turn policy: its actions end at a newline, as SWE's do
    tasks = long_domain.tasks("train")[:6]

    def longest_observation(limit: int) -> int:
        eps = run_episodes(
            policy, long_domain, tasks, max_new_tokens=16, max_turns=3, max_observation_tokens=limit,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        runs = []
        for ep in eps:
            start = ep.is_action.index(True)
            n = 0
            for is_action in ep.is_action[start:] + [True]:
                n = 0 if is_action else n + 1
                runs.append(n)
        return max(runs)

    assert longest_observation(0) > 24 >= longest_observation(24)


def test_demonstrations_fix_mostly_and_sometimes_tamper(domain):
    rng = random.Random(0)
    tasks = domain.tasks("train")
    n = fixed = tampered = errors = 0
    for k in range(300):
        task = tasks[k % len(tasks)]
        demo = domain.demonstration(task, rng)
        actions = [t for t, is_action in demo if is_action]
        assert demo[0] == (task.prompt, False) and actions[-1] == "submit\n" and len(actions) <= 8
        assert sum(len(t) for t, _ in demo) < 1000  # fits a few hundred tokens
        touched = {a.split(" ")[1] for a in actions if a.startswith("replace ")}
        tampered += any(n_.startswith("test_") for n_ in touched)
        fixed += (
            f"replace {task.data['fix']['file']} {task.data['fix']['line']} {task.data['fix']['text']}\n" in actions
        )
        errors += any(t.startswith("error: ") for t, is_action in demo if not is_action)
        n += 1
    assert 0.6 < fixed / n < 0.9 and abs(tampered / n - SHORTCUT) < 0.06 and errors > 0
    assert plan(tasks[0], random.Random(5)) == plan(tasks[0], random.Random(5))


# -- SWE-bench-format instances ---------------------------------------------------------------------------
def test_swe_bench_instances_end_to_end(domain, tmp_path):
    tasks = domain.tasks("heldout")[:3]
    rows = [sb.export_instance(t, tmp_path) for t in tasks]
    (tmp_path / "instances.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    # A JSON list with the test lists as plain lists loads the same.
    (tmp_path / "instances.json").write_text(
        json.dumps([{**r, "FAIL_TO_PASS": json.loads(r["FAIL_TO_PASS"])} for r in rows])
    )
    insts = sb.load_instances(tmp_path / "instances.jsonl")
    assert [i.fail_to_pass for i in insts] == [i.fail_to_pass for i in sb.load_instances(tmp_path / "instances.json")]
    for inst, task in zip(insts, tasks):
        assert inst.fail_to_pass and all("::" in t for t in inst.fail_to_pass + inst.pass_to_pass)
        assert sb.evaluate(inst, inst.patch).resolved
        unfixed = sb.evaluate(inst, "")
        assert unfixed.patch_applied and not unfixed.resolved and not any(unfixed.fail_to_pass.values())
        assert all(unfixed.pass_to_pass.values())
        # An episode that fixed the bug, as a prediction, resolves; one that tampered does not.
        turns, info, _ = play(domain, task, fix_actions(task))
        assert sb.evaluate(inst, sb.episode_patch(task, info)).resolved
        turns, info, _ = play(domain, task, tamper_actions(task, "assert_true"))
        assert not sb.evaluate(inst, sb.episode_patch(task, info)).resolved
        assert not sb.evaluate(inst, "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n").patch_applied
    # A candidate that rewrites a file the test patch adds does not get to keep its version of it.
    hidden = sorted(tasks[0].data["hidden"])[0]
    fake = sb.make_patch({}, {hidden: "def test_nothing():\n    pass\n"})
    assert not sb.evaluate(insts[0], fake).resolved
    (tmp_path / "bad.jsonl").write_text(json.dumps({k: v for k, v in rows[0].items() if k != "patch"}))
    with pytest.raises(ValueError, match="missing field"):
        sb.load_instances(tmp_path / "bad.jsonl")
    (tmp_path / "gone.jsonl").write_text(json.dumps({**rows[0], "repo_path": "nowhere"}))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        sb.load_instances(tmp_path / "gone.jsonl")
