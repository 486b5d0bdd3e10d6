"""The code domain: write a Python function; hidden tests in the sandbox are the audit (config.py,
domain.py; tasks.py generates tasks, data.py loads HumanEval / MBPP files, detectors.py flags
hard-coded examples and code that does not run). Registered as DOMAIN (envs/domains.py)."""

from evotrainer.envs.code import detectors
from evotrainer.envs.code.config import CodeConfig
from evotrainer.envs.domains import DetectorDefaults, DomainSpec
from evotrainer.harness.remedies import EXPLOIT_REMEDIES, partial_credit

DOMAIN = DomainSpec(
    "code",
    CodeConfig,
    detectors={
        "hardcoded_examples": DetectorDefaults(
            detectors.hardcoded_examples,
            {"min_keyed": 0.5, "max_fraction": 0.1, "min_rise": 0.05, "high_fraction": 0.5, "min_rollouts": 16},
        ),
        "exec_errors": DetectorDefaults(detectors.exec_errors, {"max_fraction": 0.3, "min_rollouts": 16}),
    },
    remedies={
        "hardcoded_examples": EXPLOIT_REMEDIES,
        # Dead groups under an all-or-nothing `correct`: pay the share of visible examples passed, never hard-coded.
        "dead_outcome_groups": (partial_credit("visible_not_hardcoded", ("correct", "correct_not_hardcoded")),),
    },
    # `correct_not_hardcoded` pays nothing for completions keyed on the visible inputs.
    audited_variants={"correct": ("correct_not_hardcoded",), "visible": ("correct_not_hardcoded",)},
)
