"""Bring your own: reward functions by import path (TRL and verl signatures), domains by import path, and
the local dataset domain, each run for real or stopped at start-up before anything is written."""

from __future__ import annotations

import json
import random
import re
import sys
import textwrap

import pytest
from rich.console import Console

from evotrainer.config import parse_config
from evotrainer.envs.env import check_env, replay
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.envs.reward_functions import check_batch
from evotrainer.errors import ConfigError
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import train_run
from tests.conftest import small_config

QUIET = Console(file=open("/dev/null", "w"))

# The user's code, written to a module of its own so that it is reached by import path as a user's would be.
USER_MODULE = '''
from evotrainer.envs.local.domain import LocalDomain


def lenient(prompts, completions, answer, **kwargs):
    """TRL's signature: one value per completion; None where the term does not apply."""
    return [None if "<answer>" not in c else len(c) + (0.5 if a in c else 0.0) for c, a in zip(completions, answer)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature; a dict's "score" is the reward."""
    return {"score": 1.0 if data_source == "math" and ground_truth in solution_str else 0.25, "acc": True}


def two_values(prompts, completions, **kwargs):
    return [1.0, 2.0]


def not_a_number(completions, **kwargs):
    return [float("nan") for _ in completions]


def no_completions(text):
    return 1.0


def skips_empty(completions, **kwargs):
    """Right on every demonstration; one value short for a completion the policy leaves empty."""
    return [float(len(c)) for c in completions if c]


def skips_unclosed(completions, **kwargs):
    """Right on every demonstration; nothing for an answer the token cap cut off."""
    return [1.0 for c in completions if c.endswith("</answer>")] if any(completions) else [0.0]


def conversational(prompts, completions, answer, **kwargs):
    """Written for a conversational dataset, as TRL calls it: prompts and completions are messages."""
    assert all(p[-1]["role"] == "user" and isinstance(p[-1]["content"], str) for p in prompts), prompts
    assert all(c[0]["role"] == "assistant" for c in completions), completions
    return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]


class Sums(LocalDomain):
    """A user's domain: two-term sums, with a field of its own (env.terms_max)."""

    @classmethod
    def from_config(cls, env, *, seed, heldout_size):
        rows = [{"prompt": f"{a} + {b} =", "answer": str(a + b)} for a in range(env.terms_max) for b in range(10)]
        return cls(rows, prompt_column="prompt", answer_column="answer", scorer="exact", seed=seed,
                   train_size=1000, heldout_size=heldout_size)


class Broken:
    @classmethod
    def from_config(cls, env, *, seed, heldout_size):
        return cls()
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_rewards.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_rewards"


def _rows(tmp_path):
    return RolloutStore(tmp_path / "runs" / "t" / "store").query()


def test_trl_reward_function_is_stored_on_every_rollout(tmp_path, math_setup, user_module):
    cfg = small_config(
        tmp_path,
        env={"reward_functions": {"lenient": f"{user_module}:lenient"}},
        harness={"reward_weights": {"correct": 1.0, "lenient": 0.01}},
        train={"steps": 2},
    )
    domain = make_domain(cfg)
    # Adding a term leaves the warm-start key alone: the session's cached base is reused.
    assert warm_start_key(cfg, domain) == warm_start_key(math_setup[0], math_setup[1])
    train_run(cfg, QUIET)
    answers = {t.id: t.data["answer"] for split in ("train", "heldout") for t in domain.tasks(split)}
    rows = _rows(tmp_path)
    assert {r["split"] for r in rows} == {"train", "heldout"}
    for r in rows:
        c = r["turns"][0]["action"]
        # TRL's None (no answer tag) is stored as 0.0: it adds nothing to the total, as in TRL.
        expected = 0.0 if "<answer>" not in c else len(c) + (0.5 if answers[r["task_id"]] in c else 0.0)
        assert r["rewards"]["lenient"] == expected, c
    # The harness weights it like a built-in term (no shaping is configured).
    train = [r for r in rows if r["split"] == "train" and r["termination"] != "tool_error"]
    for r in train:
        assert r["reward"] == pytest.approx(r["rewards"]["correct"] + 0.01 * r["rewards"]["lenient"])


def test_verl_compute_score_is_stored_on_every_rollout(tmp_path, math_setup, user_module):
    cfg = small_config(
        tmp_path, env={"reward_functions": {"verl": f"{user_module}:compute_score"}}, train={"steps": 2}
    )
    domain = make_domain(cfg)
    train_run(cfg, QUIET)
    answers = {t.id: t.data["answer"] for split in ("train", "heldout") for t in domain.tasks(split)}
    rows = _rows(tmp_path)
    assert rows
    for r in rows:
        hit = answers[r["task_id"]] in r["turns"][0]["action"]
        assert r["rewards"]["verl"] == (1.0 if hit else 0.25)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("no_such_module:fn", "cannot import"),
        ("{m}:missing", "has no attribute"),
        ("{m}:two_values", "a list of 2"),
        ("{m}:not_a_number", "nan"),
        ("{m}:no_completions", "neither a TRL"),
        ("not a path", "module:function"),
        # Wrong only for some completions: checked on a first batch's worth, not only on demonstrations.
        ("{m}:skips_empty", r"a list of 0 for 1 completion; .* \(checked on an empty completion of task"),
        ("{m}:skips_unclosed", r"a list of 0 for 1 completion; .* \(checked on a completion cut short of task"),
    ],
)
def test_reward_function_mistakes_stop_before_anything_is_written(tmp_path, user_module, path, says):
    cfg = small_config(tmp_path, env={"reward_functions": {"mine": path.format(m=user_module)}})
    with pytest.raises(ConfigError) as err:
        train_run(cfg, QUIET)
    assert "env.reward_functions.mine" in str(err.value) and re.search(says, str(err.value)), str(err.value)
    assert not (tmp_path / "runs").exists()


def test_reward_function_is_checked_on_a_first_batch(tmp_path, user_module):
    cfg = small_config(tmp_path, env={"reward_functions": {"mine": f"{user_module}:lenient"}})
    sampling = cfg.harness.sampling
    domain = make_domain(cfg)
    batch = check_batch(domain, sampling.prompts_per_step, sampling.num_generations)
    assert len({task.id for task, *_ in batch}) == sampling.prompts_per_step
    assert {what for *_, what in batch} == {"the demonstration", "a completion cut short", "an empty completion"}
    assert all(turns[-1].action for _, turns, _, what in batch if what == "the demonstration")


def test_reward_function_found_in_the_working_directory(tmp_path, monkeypatch):
    """`my_rewards:lenient` works from the directory that holds my_rewards.py, with no PYTHONPATH: a console
    script does not put the working directory on the path, and env.path is read from there too."""
    (tmp_path / "cwd_rewards.py").write_text(
        "def lenient(completions, **kwargs):\n    return [1.0 for _ in completions]\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_rewards", raising=False)
    domain = make_domain(small_config(tmp_path, env={"reward_functions": {"mine": "cwd_rewards:lenient"}}))
    assert "mine" in domain.reward_terms


def test_local_conversational_prompts_are_messages(tmp_path, user_module):
    """TRL's conversational format: the prompt is the messages, not the text of a Python list, and a TRL
    function gets prompts and completions as messages, as TRL passes them for such a dataset."""
    rows = [json.loads(line) for line in write_sums(tmp_path / "plain.jsonl").read_text().splitlines()]
    with (tmp_path / "sums.jsonl").open("w") as f:
        for r in rows:
            messages = [
                {"role": "system", "content": "Answer in <answer></answer>."},
                {"role": "user", "content": r["question"]},
            ]
            f.write(json.dumps({"prompt": messages, "solution": r["solution"]}) + "\n")
    env = _local(
        tmp_path,
        prompt_column="prompt",
        answer_column="solution",
        reward_functions={"conv": f"{user_module}:conversational"},
    )
    domain = make_domain(small_config(tmp_path, env=env))  # the check batch calls `conversational`
    task = domain.tasks("train")[0]
    assert task.prompt.startswith("system: Answer in <answer></answer>.\nuser: ") and "{" not in task.prompt
    assert task.prompt.endswith(" =\n")
    _, turns, info = replay(domain, task, domain.demonstration(task, random.Random(0)))
    assert domain.reward_terms["conv"](task, turns, info) == 1.0
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps({"prompt": [r["question"]], **r}) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"env\.prompt_column.*conversational"):
        make_domain(
            small_config(
                tmp_path,
                env=_local(
                    tmp_path, path=str(tmp_path / "bad.jsonl"), prompt_column="prompt", answer_column="solution"
                ),
            )
        )


def test_reward_function_may_not_shadow_a_builtin_term(tmp_path, user_module):
    cfg = small_config(tmp_path, env={"reward_functions": {"correct": f"{user_module}:lenient"}})
    with pytest.raises(ConfigError, match=r"env\.reward_functions\.correct"):
        make_domain(cfg)


def write_sums(path, n=300, seed=0):
    """n distinct one-digit sums of two or three terms, as JSONL with the given column names."""
    rng, seen = random.Random(seed), set()
    with path.open("w") as f:
        while len(seen) < n:
            terms = [rng.randint(0, 9) for _ in range(rng.choice((2, 3)))]
            q = " + ".join(map(str, terms)) + " ="
            if q not in seen:
                seen.add(q)
                f.write(json.dumps({"question": q, "solution": str(sum(terms))}) + "\n")
    return path


def _local(tmp_path, **env):
    return {"domain": "local", "path": str(tmp_path / "sums.jsonl"), "prompt_column": "question", **env}


def test_local_jsonl_domain_runs_with_no_code(tmp_path):
    write_sums(tmp_path / "sums.jsonl")
    cfg = small_config(tmp_path, env=_local(tmp_path, answer_column="solution", scorer="exact"), train={"steps": 2})
    domain = make_domain(cfg)
    check_env(domain)
    train, held = domain.tasks("train"), domain.tasks("heldout")
    assert len(held) == cfg.eval.heldout_size and len(train) == 300 - len(held)
    assert not {t.prompt for t in train} & {t.prompt for t in held}
    summary = train_run(cfg, QUIET)
    assert summary["steps"] == 2
    rows = _rows(tmp_path)
    by_id = {t.id: t for t in train + held}
    for r in rows:
        assert set(r["rewards"]) == {"correct", "format"}
        action = r["turns"][0]["action"]
        tagged = action.split("<answer>")[-1].split("</answer>")[0].strip() if "<answer>" in action else None
        assert r["rewards"]["correct"] == float(tagged == by_id[r["task_id"]].data["answer"])


def test_local_domain_splits_are_seeded(tmp_path):
    write_sums(tmp_path / "sums.jsonl")
    env = _local(tmp_path, answer_column="solution")
    a, b = (make_domain(small_config(tmp_path, env=env)) for _ in range(2))
    assert a is not b  # read again each time: the file may have changed
    assert [t.id for t in a.tasks("heldout")] == [t.id for t in b.tasks("heldout")]
    c = make_domain(small_config(tmp_path, env=env, run={"seed": 1, "name": "t", "out_dir": str(tmp_path)}))
    assert [t.id for t in a.tasks("heldout")] != [t.id for t in c.tasks("heldout")]


def test_local_domain_reads_parquet_and_saved_datasets(tmp_path):
    import datasets

    rows = [json.loads(line) for line in write_sums(tmp_path / "sums.jsonl").read_text().splitlines()]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "sums.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    ids = []
    for path in ("sums.jsonl", "sums.parquet", "saved"):
        env = _local(tmp_path, path=str(tmp_path / path), answer_column="solution")
        ids.append([(t.prompt, t.data["answer"]) for t in make_domain(small_config(tmp_path, env=env)).tasks("train")])
    assert ids[0] == ids[1] == ids[2]


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"path": "missing.jsonl"}, "env.path"),
        ({"path": None}, "env.path"),
        ({"answer_column": "answer"}, "env.answer_column"),  # the file's column is `solution`
        ({"prompt_column": "prompt", "answer_column": "solution"}, "env.prompt_column"),
        ({"answer_column": "solution", "path": "sums.csv"}, "env.path"),
    ],
)
def test_local_domain_mistakes_name_the_field(tmp_path, env, field):
    write_sums(tmp_path / "sums.jsonl")
    (tmp_path / "sums.csv").write_text("question,solution\n1 + 1 =,2\n")
    if env.get("path"):
        env["path"] = str(tmp_path / env["path"])
    cfg = small_config(tmp_path, env=_local(tmp_path, **env))
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        train_run(cfg, QUIET)
    assert not (tmp_path / "runs").exists()


def test_local_domain_too_small_for_the_heldout_set(tmp_path):
    write_sums(tmp_path / "sums.jsonl", n=100)
    cfg = small_config(tmp_path, env=_local(tmp_path, answer_column="solution"))
    with pytest.raises(ConfigError, match=r"eval\.heldout_size"):
        make_domain(cfg)


def test_domain_by_import_path(tmp_path, user_module):
    cfg = small_config(tmp_path, env={"domain": f"{user_module}:Sums", "terms_max": 20})
    domain = make_domain(cfg)  # check_env ran on it
    assert make_domain(cfg) is not domain  # built each time: a user's factory may keep state
    assert len(domain.tasks("heldout")) == cfg.eval.heldout_size and domain.tasks("train")
    for path, says in ((f"{user_module}:Broken", "lacks"), (f"{user_module}:Nope", "cannot import")):
        with pytest.raises(ConfigError, match=r"env\.domain.*" + says):
            make_domain(small_config(tmp_path, env={"domain": path}))
    with pytest.raises(ConfigError, match=r"env\.domain"):
        parse_config({"env": {"domain": "mypkg:not valid"}})


def test_a_loop_run_trains_on_a_user_s_term_and_its_rollouts_carry_it(tmp_path, user_module, math_setup):
    """The loop's own stages (segment, race, gate) under a harness whose reward is the user's term (verl's
    signature) beside `correct`: every training rollout of every arm carries it, and the stored total is
    the weighted sum the harness says."""
    from evotrainer.loop import run_loop

    cfg = small_config(
        tmp_path,
        env={"reward_functions": {"verl_term": f"{user_module}:compute_score"}},
        harness={"reward_weights": {"correct": 1.0, "verl_term": 0.5}},
        loop={
            "segment_steps": 2,
            "trial_steps": 2,
            "candidates": 1,
            "max_rounds": 1,
            "skills_dir": str(tmp_path / "skills"),
            "max_trial_share": 1.0,
        },
    )
    summary = run_loop(cfg, QUIET)
    assert summary["rounds"] == 1
    rows = [r for r in _rows(tmp_path) if r["split"] == "train"]
    branches = {r["branch"] for r in rows}
    assert {"r01-seg", "r01-ctl"} <= branches, branches
    for r in rows:
        assert r["rewards"]["verl_term"] in (1.0, 0.25)
    ctl = [r for r in rows if r["branch"] == "r01-ctl"]
    assert all(r["reward"] == pytest.approx(r["rewards"]["correct"] + 0.5 * r["rewards"]["verl_term"]) for r in ctl)
