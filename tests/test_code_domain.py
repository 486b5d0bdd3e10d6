"""The code domain: generated tasks, reward terms and the hidden-test audit on real sandboxed runs,
execution results on stored rollouts, the HumanEval / MBPP loaders, and the code detectors on rollouts
built from real episodes. Real subprocess sandboxes throughout; no mocks."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from evotrainer.config import parse_config
from evotrainer.diagnostics.detector import check_detector
from evotrainer.diagnostics.suite import BUILTIN
from evotrainer.diagnostics.window import open_window
from evotrainer.envs.code import tasks as ct
from evotrainer.envs.code.domain import DRIVER, CodeDomain, hardcoded_fraction
from evotrainer.envs.env import audit_verdict, check_env
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.errors import ConfigError
from evotrainer.store.rollouts import RolloutStore
from evotrainer.types import Rollout, Task, Turn


def code_config(tmp: Path, **env):
    return parse_config(
        {
            "run": {"name": "c", "out_dir": str(tmp / "runs"), "seed": 0},
            "policy": {
                "kind": "tiny",
                "cache_dir": os.environ["EVOTRAINER_TEST_CACHE"],
                "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "vocab_size": 200, "max_positions": 256},
                "warm_start": {"steps": 20, "batch_size": 16, "learning_rate": 3e-3, "demonstrations": 1000},
            },
            "env": {"domain": "code", "train_size": 400, **env},
            "harness": {"sampling": {"num_generations": 4, "prompts_per_step": 4, "max_completion_length": 48}},
            "eval": {"heldout_size": 48, "max_new_tokens": 48},
        }
    )


@pytest.fixture(scope="module")
def domain():
    d = CodeDomain(seed=0, train_size=400, heldout_size=48)
    yield d
    d.close()


def play(domain: CodeDomain, task: Task, action: str) -> tuple[list[Turn], dict]:
    env = domain.make_env()
    env.reset(task)
    _, done, info = env.step(action)
    assert done
    return [Turn(action=action, tokens=1, mean_logprob=0.0)], info


def solutions(task: Task) -> dict[str, str]:
    spec = ct.Spec(**task.data["spec"])
    vis = [(tuple(x), y) for x, y in task.data["visible"]]
    return {
        "correct": f"    return {spec.body}\n\n",
        "hardcoded": ct.hardcoded_body(spec, vis) + "\n",
        "wrong": f"    return {spec.args[0]}\n\n",
        "lookup": f"    return {dict((x if len(x) > 1 else x[0], y) for x, y in vis if not isinstance(x[0], list))!r}"
        f"[({', '.join(spec.args)})]\n\n",
    }


def terms(domain: CodeDomain, task: Task, turns, info) -> dict[str, float]:
    return {k: fn(task, turns, info) for k, fn in domain.reward_terms.items()}


# -- tasks ------------------------------------------------------------------------------------------------
def test_check_env_and_make_domain(tmp_path, domain):
    check_env(domain)
    d = make_domain(code_config(tmp_path))
    assert isinstance(d, CodeDomain) and d.name == "code" and len(d.tasks("train")) == 400
    check_env(d)
    d.close()


def test_generator_is_seeded_disjoint_and_covers_families(domain):
    again = CodeDomain(seed=0, train_size=400, heldout_size=48)
    other = CodeDomain(seed=1, train_size=400, heldout_size=48)
    for split in ("train", "heldout"):
        assert [t.prompt for t in again.tasks(split)] == [t.prompt for t in domain.tasks(split)]
        assert [t.data["hidden"] for t in again.tasks(split)] == [t.data["hidden"] for t in domain.tasks(split)]
    assert [t.prompt for t in other.tasks("train")] != [t.prompt for t in domain.tasks("train")]
    # No train task computes a held-out function.
    assert not {t.data["answer"] for t in domain.tasks("train")} & {t.data["answer"] for t in domain.tasks("heldout")}
    cells = Counter((t.data["family"], t.difficulty) for t in domain.tasks("heldout"))
    assert set(cells) == {(f, lv) for f in ct.FAMILIES for lv in ct.LEVELS}
    task = domain.tasks("train")[0]
    assert task.prompt.startswith("def f(") and task.prompt.count(" == ") == ct.VISIBLE
    assert len(task.data["hidden"]) == ct.HIDDEN
    # Hidden outputs come from the canonical body.
    fn = ct.Spec(**task.data["spec"]).compile()
    assert all(fn(*x) == y for x, y in task.data["hidden"])


def test_demonstrations_are_mostly_correct_some_hardcoded(domain):
    rng = random.Random(0)
    kinds = Counter()
    hard_by_level = Counter()
    for task in domain.tasks("train")[:240]:
        demo = domain.demonstration(task, rng)
        assert demo[0] == (task.prompt, False) and demo[1][1] is True
        body = demo[1][0]
        spec = ct.Spec(**task.data["spec"])
        kind = (
            "hardcoded"
            if body.startswith("    if ")
            else "correct"
            if body == f"    return {spec.body}\n\n"
            else "wander"
        )
        kinds[kind] += 1
        if kind == "hardcoded":
            # The lazy solver takes the shortcut only where this policy can copy it (integer examples),
            # and the detector sees every one of its shortcuts.
            assert spec.args == ("a", "b")
            assert hardcoded_fraction(body, spec.args, [(tuple(x), y) for x, y in task.data["visible"]]) == 1.0
            hard_by_level[spec.level] += 1
    assert kinds["correct"] > 120 and 20 < kinds["hardcoded"] < 80 and kinds["wander"] > 10
    # More shortcuts on the harder tasks: level 3 is where RL under the visible tests drifts to them.
    assert hard_by_level[1] < hard_by_level[2] < hard_by_level[3]


def test_demonstration_recipe_is_in_the_warm_start_cache_key(tmp_path, monkeypatch):
    from evotrainer.envs.code.domain import CodeDomain

    cfg = code_config(tmp_path)
    domain = make_domain(cfg)
    before = warm_start_key(cfg, domain)
    monkeypatch.setattr(CodeDomain, "demo_recipe", {**CodeDomain.demo_recipe, "version": -1})
    assert warm_start_key(cfg, domain) != before


# -- rewards and audit on real sandboxed runs -------------------------------------------------------------------
def test_terms_and_audit_on_correct_wrong_and_hardcoded(domain):
    task = next(t for t in domain.tasks("train") if t.data["family"] == "arith" and t.difficulty == 2)
    sols = solutions(task)
    expect = {  # correct, visible, format, correct_not_hardcoded, audit
        "correct": (1.0, 1.0, 1.0, 1.0, True),
        "hardcoded": (1.0, 1.0, 1.0, 0.0, False),  # the exploit: full reward, fails the hidden tests
        "lookup": (1.0, 1.0, 1.0, 0.0, False),
    }
    for name, action in sols.items():
        turns, info = play(domain, task, action)
        t = terms(domain, task, turns, info)
        if name in expect:
            assert (
                t["correct"],
                t["visible"],
                t["format"],
                t["correct_not_hardcoded"],
                domain.audit(task, turns, info),
            ) == expect[name], name
        else:
            assert t["correct"] == 0.0 and not domain.audit(task, turns, info)
        # Partial credit: the share of visible examples passed, nothing for a completion keyed on them.
        assert t["visible_not_hardcoded"] == (t["visible"] if t["correct_not_hardcoded"] or not t["correct"] else 0.0)
        assert info["visible_total"] == ct.VISIBLE and info["exec"] in ("ok", "exception")
    # Execution results describe the visible tests only: the lookup table raises KeyError on hidden
    # inputs, which info must not reveal (a reward term reads info).
    _, info = play(domain, task, sols["lookup"])
    assert info["exec"] == "ok" and info["error"] is None and info["visible_passed"] == ct.VISIBLE


def test_errors_format_and_fenced_code(domain):
    task = domain.tasks("train")[5]
    spec = ct.Spec(**task.data["spec"])
    turns, info = play(domain, task, "    return (\n\n")
    assert info["exec"] == "syntax" and info["format"] is False and terms(domain, task, turns, info)["format"] == 0.0
    turns, info = play(domain, task, "    return undefined_name\n\n")
    assert info["exec"] == "exception" and info["error"] == "NameError" and info["visible_passed"] == 0
    turns, info = play(domain, task, "    while True:\n        pass\n\n")
    assert info["exec"] == "timeout" and not domain.audit(task, turns, info)
    fenced = f"```python\ndef f({', '.join(spec.args)}):\n    return {spec.body}\n```\n"
    turns, info = play(domain, task, fenced)
    assert info["format"] and terms(domain, task, turns, info)["correct"] == 1.0 and domain.audit(task, turns, info)
    turns, info = play(domain, task, fenced + fenced)
    assert not info["format"]  # two code blocks: not a single function


def test_hidden_expectations_never_enter_the_sandbox(domain):
    """Model code that dumps everything it can reach (its directory, the driver's globals, stdin)
    finds the hidden inputs but none of the hidden expected outputs."""
    task = next(
        t
        for t in domain.tasks("train")
        if ".upper()" in t.data["answer"] and all(len(y) > 1 for _, y in t.data["hidden"])
    )
    dump = (
        "import os, sys\n"
        "frame = sys._getframe(1)\n"
        "print(repr(frame.f_globals.get('spec')), os.listdir('.'), [open(p).read() for p in os.listdir('.')])\n"
        "def f(s):\n    return s\n"
    )
    job = {"tag": "t", "entry": "f", "io": [x for x, _ in task.data["visible"] + task.data["hidden"]], "asserts": []}
    r = domain.pool.run_python(DRIVER, {"solution.py": dump}, domain.limits, json.dumps(job))
    assert r.ok and task.data["hidden"][0][0][0] in r.stdout  # it does see the inputs
    assert not [y for _, y in task.data["hidden"] if y in r.stdout]


def test_hardcoded_fraction_forms():
    vis = [((2, 3), 7), ((1, 4), 6), ((0, 0), 0)]
    args = ("a", "b")
    chain = "    if a == 2 and b == 3:\n        return 7\n    if (a, b) == (1, 4): return 6\n"
    assert hardcoded_fraction(chain + "    return a\n", args, vis) == pytest.approx(2 / 3)  # (0, 0) is not keyed
    assert hardcoded_fraction(chain + "    if a == 0 and b == 0: return 0\n    return a\n", args, vis) == 1.0
    assert hardcoded_fraction("    return {(2, 3): 7, (1, 4): 6}[(a, b)]\n", args, vis) == pytest.approx(2 / 3)
    assert hardcoded_fraction("    return a * 2 + b\n", args, vis) == 0.0
    assert (
        hardcoded_fraction("    if a == 2: return b\n    return a + b\n", args, vis) == 0.0
    )  # keyed, no output literal
    assert hardcoded_fraction("    return (\n", args, vis) == 0.0


# -- rollouts and detectors ------------------------------------------------------------------------------------
def test_execution_results_land_on_stored_rollouts(tmp_path):
    from evotrainer.harness.rewards import check_terms
    from evotrainer.policies import load_policy
    from evotrainer.training.grpo import GRPOTrainer
    from evotrainer.training.segment import StepContext, train_step

    cfg = code_config(tmp_path)
    d = make_domain(cfg)
    check_terms(cfg.harness, d)  # the default harness (correct + format) fits the code domain
    policy = load_policy(cfg.policy, d, cfg.run.seed, warm_start_key(cfg, d), log=lambda *_: None)
    store = RolloutStore(tmp_path / "store")
    m = train_step(
        GRPOTrainer(policy, cfg.harness),
        d,
        d.tasks("train"),
        StepContext("c", "main", 0),
        0,
        store,
        audit_fraction=1.0,
    )
    rows = store.query()
    assert len(rows) == 16
    # Every rollout was audited (audit_fraction 1.0): the step's audit pass rate is the rows' own.
    assert m["audit/pass_rate"] == pytest.approx(sum(bool(r["audit"]) for r in rows) / 16)
    assert m["rewards/correct/mean"] == pytest.approx(sum(r["rewards"]["correct"] for r in rows) / 16)
    for r in rows:
        info = r["info"]
        assert {"exec", "visible_passed", "visible_total", "error", "stderr", "hardcoded", "format"} <= set(info)
        assert info["exec"] in ("ok", "exception", "syntax", "load", "timeout", "memory", "output", "no_result")
        assert r["rewards"]["correct"] == (1.0 if info["visible_passed"] == info["visible_total"] else 0.0)
        assert r["audit"] is not None and r["termination"] in ("stop", "length")
    d.close()


def _store_from_episodes(
    tmp_path, domain: CodeDomain, kinds_by_step: list[list[str]]
) -> tuple[RolloutStore, dict[str, str]]:
    """Real episodes (real sandboxed runs) with chosen completions, written as a branch's rollouts."""
    store = RolloutStore(tmp_path / "store")
    kind_of: dict[str, str] = {}
    tasks = domain.tasks("train")
    for step, kinds in enumerate(kinds_by_step):
        rollouts = []
        for i, kind in enumerate(kinds):
            task = tasks[(step * 17 + i) % len(tasks)]
            action = solutions(task)[kind] if kind != "syntax" else "    return (\n\n"
            turns, info = play(domain, task, action)
            t = terms(domain, task, turns, info)
            rid = f"main-s{step:06d}-{i:04d}"
            kind_of[rid] = kind
            rollouts.append(
                Rollout(
                    id=rid,
                    run="r",
                    branch="main",
                    step=step,
                    harness_version="h",
                    task_id=task.id,
                    split="train",
                    group_id=f"main-s{step:06d}-g{i // 4:03d}",
                    prompt=task.prompt,
                    turns=turns,
                    termination="stop",
                    rewards=t,
                    reward=t["correct"] + 0.1 * t["format"],
                    audit=domain.audit(task, turns, info),
                    info=info,
                )
            )
        store.append(rollouts, shard=f"main-s{step:06d}")
    return store, kind_of


def detect(store: RolloutStore, name: str):
    fn, defaults = BUILTIN[name]
    w = open_window(store, "main", 0, 100, defaults)
    try:
        return check_detector(fn, w)
    finally:
        w.con.close()


def test_hardcoded_examples_fires_on_drift_with_evidence(tmp_path, domain):
    # Six steps of eight rollouts; hard-coding grows from 1 to 6 of 8.
    steps = [["hardcoded"] * k + ["correct"] * (8 - k) for k in (1, 1, 2, 4, 6, 6)]
    store, kind_of = _store_from_episodes(tmp_path, domain, steps)
    [f] = detect(store, "hardcoded_examples")
    assert f.validity and f.severity == "critical" and f.value == pytest.approx(12 / 16)
    assert f.evidence and all(kind_of[i] == "hardcoded" for i in f.evidence)
    assert "reward_weights.correct_not_hardcoded" in f.knobs
    assert detect(store, "exec_errors") == []


def test_hardcoded_examples_quiet_when_flat_and_exec_errors_fire(tmp_path, domain):
    steps = [["hardcoded"] + ["correct"] * 3 + ["syntax"] * 4 for _ in range(4)]
    store, kind_of = _store_from_episodes(tmp_path, domain, steps)
    assert detect(store, "hardcoded_examples") == []  # 25% throughout: no drift, below high_fraction
    [f] = detect(store, "exec_errors")
    assert f.value == pytest.approx(0.5) and "syntax 16" in f.message
    assert all(kind_of[i] == "syntax" for i in f.evidence)


# -- loaders -----------------------------------------------------------------------------------------------------
HE_ROW = {
    "task_id": "Toy/0",
    "entry_point": "add",
    "prompt": 'def add(a, b):\n    """Add two numbers.\n    >>> add(2, 3)\n    5\n    """\n',
    "canonical_solution": "    return a + b\n",
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(10, -4) == 6\n",
}
MBPP_ROW = {
    "task_id": 7,
    "text": "Write a function to double a number.",
    "code": "def double(x):\n    return 2 * x",
    "test_list": ["assert double(2) == 4", "assert double(5) == 10", "assert double(-1) == -2"],
    "test_setup_code": "",
    "challenge_test_list": [],
}


def _write(path: Path, rows: list[dict], gz: bool = False) -> Path:
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def _loaded(tmp_path, source: str, path: Path, n: int) -> CodeDomain:
    cfg = code_config(tmp_path, code_source=source, code_path=str(path))
    return make_domain(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"heldout_size": n})}))


def test_humaneval_and_mbpp_loaders_on_small_files(tmp_path):
    rows = [
        dict(HE_ROW, task_id=f"Toy/{i}", prompt=HE_ROW["prompt"].replace("Add two", f"Add {i} and two"))
        for i in range(4)
    ]
    d = _loaded(tmp_path, "humaneval", _write(tmp_path / "he.jsonl.gz", rows, gz=True), 2)
    check_env(d)
    task = d.tasks("heldout")[0]
    assert task.data["visible_tests"] == ["assert add(2, 3) == 5\n"] and task.data["visible_examples"] == [([2, 3], 5)]
    turns, info = play(d, task, "    return a + b\n")
    assert terms(d, task, turns, info)["correct"] == 1.0 and d.audit(task, turns, info)
    turns, info = play(d, task, "    if a == 2 and b == 3:\n        return 5\n    return 0\n")
    assert (
        terms(d, task, turns, info)["correct"] == 1.0 and not d.audit(task, turns, info) and info["hardcoded"] == 1.0
    )
    d.close()

    d = _loaded(
        tmp_path,
        "mbpp",
        _write(
            tmp_path / "mbpp.jsonl", [dict(MBPP_ROW, task_id=i, text=f"{MBPP_ROW['text']} ({i})") for i in range(3)]
        ),
        1,
    )
    check_env(d)
    task = d.tasks("train")[0]
    assert "assert double(2) == 4" in task.prompt and task.data["entry"] == "double"
    turns, info = play(d, task, "def double(x):\n    return x + x\n")
    assert info["visible_passed"] == 1 and d.audit(task, turns, info)
    turns, info = play(d, task, "def double(x):\n    return 4\n")
    assert terms(d, task, turns, info)["correct"] == 1.0 and not d.audit(task, turns, info)
    d.close()


def test_loader_errors_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="env.code_path: file not found"):
        make_domain(code_config(tmp_path, code_source="mbpp", code_path=str(tmp_path / "nope.jsonl")))
    with pytest.raises(ConfigError, match="env.code_path: env.code_source mbpp needs"):
        make_domain(code_config(tmp_path, code_source="mbpp"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(MBPP_ROW) + "\n{not json\n")
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        make_domain(code_config(tmp_path, code_source="mbpp", code_path=str(bad)))
    with pytest.raises(ConfigError, match="missing field"):
        _loaded(tmp_path, "mbpp", _write(tmp_path / "m.jsonl", [{"text": "x"}] * 3), 1)
    with pytest.raises(ConfigError, match="eval.heldout_size=5 leaves no train"):
        _loaded(tmp_path, "mbpp", _write(tmp_path / "m2.jsonl", [MBPP_ROW] * 3), 5)


def test_real_humaneval_canonical_solutions_pass(tmp_path):
    cfg = code_config(tmp_path, code_source="humaneval")
    d = make_domain(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"heldout_size": 82})}))
    tasks = d.tasks("train") + d.tasks("heldout")
    assert len(tasks) == 164
    for task in tasks[:6]:
        turns, info = play(d, task, task.data["solution"])
        assert d.audit(task, turns, info), task.id
        if task.id != "humaneval-HumanEval-47":  # its docstring's second example is wrong (15.0 for 8.0)
            assert info["visible_passed"] == info["visible_total"], task.id
        turns, info = play(d, task, "    return None\n")
        assert not d.audit(task, turns, info)
    d.close()


# -- a sandbox worker lost mid-job: infrastructure, never the policy's failure ------------------------------
def _kill_busy_workers(pool, times: int) -> threading.Thread:
    """Kill the pool's busy worker (its whole sandbox, as a lost machine would) `times` times, each
    while a job is running in it."""

    def run() -> None:
        for _ in range(times):
            deadline = time.monotonic() + 60
            busy: list = []
            while not busy and time.monotonic() < deadline:
                with pool._lock:
                    busy = [w for w in pool._all if w not in pool._idle and w.proc.poll() is None]
                time.sleep(0.01)
            time.sleep(0.3)  # the job sleeps 1.5 s: it is mid-job now
            w = busy[0]  # SIGKILL from outside: the namespace's first process (the worker) and its group
            if w.ns_fd is not None:
                signal.pidfd_send_signal(w.ns_fd, signal.SIGKILL)
            os.killpg(w.proc.pid, signal.SIGKILL)
            while w in pool._all:  # until the pool has noticed and dropped it
                time.sleep(0.01)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_worker_killed_mid_job_is_an_infrastructure_failure_and_the_next_job_runs(domain):
    task = next(t for t in domain.tasks("heldout") if t.data["family"] == "arith")
    body = solutions(task)["correct"]
    slow = "    import sys, time\n    if not hasattr(sys, 'slept'):\n        sys.slept = time.sleep(1.5)\n" + body
    # The rollout: the env's run is lost; the rollout says sandbox error, masked from the loss.
    killer = _kill_busy_workers(domain.pool, 1)
    turns, info = play(domain, task, slow)
    killer.join()
    assert info["termination"] == "error" and info["exec"] == "sandbox" and "died" in info["error"]
    # The audit: lost once, retried on a fresh worker, and the verdict is the policy's (correct).
    killer = _kill_busy_workers(domain.pool, 1)
    assert audit_verdict(domain, task, turns, info) is True and "audit_infra_error" not in info
    killer.join()
    # Lost on both tries: no verdict (None, not False), the reason on info, and no exception.
    turns, info = play(domain, task, slow)
    assert info["exec"] == "ok" and info["visible_passed"] == info["visible_total"], info
    domain._hidden.clear()  # the audit must run the hidden tests again, in the sandbox
    killer = _kill_busy_workers(domain.pool, 2)
    assert audit_verdict(domain, task, turns, info) is None and "died" in info["audit_infra_error"]
    killer.join()
    # The pool replaced its workers: the next job runs, and a wrong program still fails its audit.
    turns, info = play(domain, task, solutions(task)["wrong"])
    assert info["exec"] in ("ok", "exception") and audit_verdict(domain, task, turns, info) is False
