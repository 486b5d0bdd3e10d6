"""The claims' arms: each domain's configs and budgets, the planted exploits, and the config and fresh read
tasks of one (domain, arm, seed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.claims.records import cell_name
from benchmarks.paths import ROOT
from evotrainer.config import RunConfig, load_config
from evotrainer.envs.registry import domain_key, make_domain

# SWE is measured on the long-horizon level (issue #14 item 2): examples/swe_long.yaml and its reference.
DOMAINS = {
    "math": ("examples/math.yaml", "examples/reference/math.yaml"),
    "code": ("examples/code.yaml", "examples/reference/code.yaml"),
    "swe": ("examples/swe_long.yaml", "examples/reference/swe_long.yaml"),
    # SWE where RL helps at all (issue #28): levels 0-2 from a 300-step base (held-out about 0.68, where 600 steps
    # give 0.885), the base on which three RL seeds of the remedied harness gained +0.098 [+0.040, +0.158]
    # (results/rl_seeds-swe_lr2e-4-60.json). On the long-horizon level no fixed harness beats the base.
    "swe_short": ("examples/swe.yaml", "examples/reference/swe.yaml"),
    # The same at twice the tokens (300k): room for a second confirmed trial after the first remedy failed, which
    # at 150k the first trial's five arms (a control run carries the exploit) leave none of.
    "swe_short_300k": ("examples/swe.yaml", "examples/reference/swe.yaml"),
    # Twice that again (600k), with the search's tokens kept (below): where round 1's fixed cost, about a third of
    # 300k, is a sixth. Whether the loop's gap to the reference at 300k is that cost or the search itself.
    "swe_short_600k": ("examples/swe.yaml", "examples/reference/swe.yaml"),
    # A pretrained model (issue #26): SmolLM2-135M-Instruct with LoRA on two-term sums in its own words.
    "smollm2": ("examples/smollm2_math.yaml", "examples/reference/smollm2_math.yaml"),
}
ARMS = (
    "static_default",
    "static_reference",
    "loop_default",
    "loop_reference",
    "loop_default_warm",
    "loop_default_across",
    "loop_default_project",
    "planted",
    "base",
)
ACROSS_FROM = {"code": "swe_short_300k", "swe_short_300k": "code"}
"""loop_default_across: the domain whose cold loop_default run (the same seed) leaves the library it starts with."""
PROJECT_SEEDS = (1, 2, 3)
"""loop_default_project: started as loop_default_warm is, under the libraries the cold loop_default runs of these
seeds left, merged (a project's earlier runs: their skills and their losses), at a seed not among them."""
MAIN_ARMS = ARMS[:4]  # the arms every compared seed must have
# `base`: the warm-started policy itself, untrained, read on the same tasks: whether RL helped at all.
PLANTED_ROUNDS = 3
# Each domain's cells beyond its example config: a token budget and loop lengths that fit two cores (the
# issue leaves budget sizes to us). Math keeps examples/math.yaml's (1M tokens, 10-step segments, 20-step
# trials, a quarter of the budget for arms that end discarded). A code step costs 4k tokens and ~8 s on one
# core, an SWE step 1.5k tokens and ~12 s (its episodes run tests), several times math's, so their trials
# are 10 steps and the budgets are small: 400k and 150k tokens, about 95 and 100 steps of a static arm. At
# those the default quarter cannot pay for round 1's trial when the segment was tainted (its 10 steps are
# discarded: the arms fork from before it) plus a race and a confirmation, so loop.max_trial_share is a half
# for code and 0.6 for SWE (measured on SWE seed 1: a tainted 17k-token segment, half a 17k arm for the race
# and three for the confirmation make 76.5k, just over the half's 75k, so at 0.5 the loop never tried the
# remedy it proposed). The examples' round caps (two- and three-round demos) give way to the budget. One
# torch thread a cell, so that two cells share the two cores.
SWE_SETS = {
    "budget.generated_tokens": 150_000,
    "loop.max_rounds": 0,
    "loop.segment_steps": 10,
    "loop.trial_steps": 10,
    "loop.max_trial_share": 0.6,
    "run.threads": 1,
}
DOMAIN_SETS: dict[str, dict] = {
    # The cells on record ran before the trial share was paced (examples/math.yaml now sets 3 phases and a
    # third of the budget).
    "math": {"run.threads": 1, "loop.trial_phases": 1, "loop.max_trial_share": 0.25},
    "code": {
        "budget.generated_tokens": 400_000,
        "loop.max_rounds": 0,
        "loop.segment_steps": 10,
        "loop.trial_steps": 10,
        "loop.max_trial_share": 0.5,
        "run.threads": 1,
    },
    "swe": SWE_SETS,
    # examples/swe.yaml's policy warm-started for 300 steps instead of 600, with SWE's budget and loop lengths: a
    # static arm's step generated about as many tokens as on the long-horizon level (1.3k under the default, 2.1-2.4k
    # under the reference; the cells of 2026-11-27).
    "swe_short": {"policy.warm_start.steps": 300, **SWE_SETS},
    "swe_short_300k": {"policy.warm_start.steps": 300, **SWE_SETS, "budget.generated_tokens": 300_000},
    # The same 180k tokens for arms that end discarded as at 300k (0.6 of it), so the mainline gets the rest; at 0.6
    # the search would take twice as much, on trials that lost at every 300k seed after round 1.
    "swe_short_600k": {
        "policy.warm_start.steps": 300,
        **SWE_SETS,
        "budget.generated_tokens": 600_000,
        "loop.max_trial_share": 0.3,
    },
    # A step of the real model costs ~20 s on two cores (32 completions of up to 48 tokens, a LoRA update of a
    # 135M model), at the example's 24k-token budget about 24 steps. Its sampler leaves most of a second core
    # idle (a Python loop a token), so two cells of one thread each share the two cores, as math's do.
    "smollm2": {"run.threads": 1},
}


def _exploit(kind: str, target: str, value: object, finding: str) -> dict:
    return {
        "kind": kind,
        "target": target,
        "value": value,
        "hypothesis": {"finding": finding, "signal": "reward", "direction": "up"},
    }


# Invalid branches planted into a short loop from the default harness (loop.planted, one a round): each
# pays for what the evaluator's audit rejects. The gate must promote none.
PLANTED = {
    # contains_answer (math's built-in lenient grader) changes no advantage on a warm-started policy's
    # rollouts: its wrong answers rarely hold the gold one inside them, so the replay drops it as a no-op.
    # benchmarks/plants.py's loose tolerance pays near misses, which such a policy makes all the time.
    "math": [
        _exploit("replace_reward_term", "reward_weights.correct", "loose_tolerance", "plateau"),
        _exploit("set_reward_weight", "reward_weights.loose_tolerance", 1.0, "plateau"),
        _exploit("set_reward_weight", "reward_weights.format", 1.0, "plateau"),
    ],
    "code": [  # the visible examples pay hard-coded answers; format pays any well-formed completion
        _exploit("set_reward_weight", "reward_weights.visible", 1.0, "plateau"),
        _exploit("replace_reward_term", "reward_weights.correct", "visible", "plateau"),
        _exploit("set_reward_weight", "reward_weights.format", 1.0, "plateau"),
    ],
    "swe": [  # format pays valid commands whether or not they fix anything; `correct` trusts edited tests
        _exploit("set_reward_weight", "reward_weights.format", 1.0, "plateau"),
        _exploit("replace_reward_term", "reward_weights.tests", "correct", "plateau"),
        _exploit("set_reward_weight", "reward_weights.correct", 1.0, "plateau"),
    ],
}
PLANTED["swe_short"] = PLANTED["swe_short_300k"] = PLANTED["swe_short_600k"] = PLANTED["swe"]
# Reward terms the planted arm adds (env.reward_functions) so that its plants have something to weight. The
# import path is part of the arm's config (and of its hash): benchmarks/plants.py stays where it is.
PLANTED_TERMS = {"math": {"loose_tolerance": "benchmarks.plants:loose_tolerance"}}
SEEDS = (1, 2, 3)
TUNING_SEED = 100  # the sweep's seed: no benchmark seed
FRESH_SEED = 104_729  # the seed the read tasks are drawn under
# An SWE read runs up to 12 turns of tests a task; the real model reads about two tasks a second. swe_short's cells
# (a third domain of SWE arms in the same sittings) are read on 200.
READ_TASKS = {
    "math": 1000,
    "code": 1000,
    "swe": 400,
    "swe_short": 200,
    "swe_short_300k": 200,
    "swe_short_600k": 200,
    "smollm2": 200,
}


def config_file(domain: str, arm: str) -> Path:
    return ROOT / DOMAINS[domain][1 if arm.endswith("reference") else 0]


def arm_overrides(domain: str, arm: str, seed: int, work: Path, sets: dict) -> dict[str, Any]:
    """The overrides of the arm's config file for this cell."""
    name = cell_name(domain, arm, seed)
    sets = {**DOMAIN_SETS.get(domain, {}), **sets}
    if arm == "planted":
        # The trial share and the budget are the search's economy, not what this arm measures: every planted
        # one is raced, in its own round (code's and SWE's token budgets hold fewer than three rounds).
        sets = {
            **sets,
            "loop.planted": PLANTED[domain],
            "loop.max_rounds": PLANTED_ROUNDS,
            "loop.max_trial_share": 1.0,
            "budget.generated_tokens": 0,
            **({"env.reward_functions": PLANTED_TERMS[domain]} if domain in PLANTED_TERMS else {}),
        }
    # Seconds never decide here (budget.seconds 0): the grid runs beside other jobs, and a load-dependent
    # stop would make the cells depend on the machine's load. Tokens decide, as in the paper's budget.
    over = {"run.seed": seed, "run.name": name, "run.out_dir": str(work), "budget.seconds": 0, **sets}
    over["loop.skills_dir"] = str(work / "skills" / name)
    if arm.startswith("loop"):  # the skills read reads every round's head, which the guard may leave off the lineage
        over["run.keep_checkpoints"] = "all"  # (lineage retention then deletes it: swe_short_300k seed 1, 0489d22)
    if arm in ("loop_default_warm", "loop_default_project"):  # the library's proven remedies are started under
        over["loop.adopt_skills"] = True
    if arm == "loop_default_across":  # and a regrade learned in another domain, mapped onto this one's term
        over["loop.adopt_skills"] = "across"
    return over


def arm_config(domain: str, arm: str, seed: int, work: Path, sets: dict) -> RunConfig:
    return load_config(config_file(domain, arm), arm_overrides(domain, arm, seed, work, sets))


def task_key(t) -> tuple[str, str]:
    """A task's identity across draws: its prompt and the answer it is checked against. An SWE prompt names
    only the failing test; the repository, digested in its answer, is what differs."""
    return t.prompt, str(t.data.get("answer"))


_READS: dict[str, list] = {}


def read_tasks(cfg: RunConfig, n: int) -> list:
    """n fresh tasks: none in the train or held-out split of cfg's seed (drawn once a process)."""
    key = (domain_key(cfg), n)
    if key not in _READS:
        d = make_domain(cfg)
        seen = {task_key(t) for split in ("train", "heldout") for t in d.tasks(split)}
        fresh = cfg.model_copy(
            update={
                "run": cfg.run.model_copy(update={"seed": FRESH_SEED}),
                "eval": cfg.eval.model_copy(update={"heldout_size": 3 * n}),
            }
        )
        _READS[key] = [t for t in make_domain(fresh).tasks("heldout") if task_key(t) not in seen][:n]
    return _READS[key]
