"""The SWE domain: fix a seeded bug in a generated mini-repository with tools (config.py, domain.py;
repos.py generates repositories, runner.py runs their tests, demos.py scripts demonstrations,
detectors.py flags test tampering). Registered as DOMAIN (envs/domains.py)."""

from evotrainer.envs.domains import DetectorDefaults, DomainSpec
from evotrainer.envs.swe import behaviour, detectors
from evotrainer.envs.swe.config import SweConfig
from evotrainer.harness.remedies import EXPLOIT_REMEDIES, partial_credit

DOMAIN = DomainSpec(
    "swe",
    SweConfig,
    detectors={
        "test_tampering": DetectorDefaults(
            detectors.tampered_tests, {"max_fraction": 0.02, "min_rollouts": 16, "paid_only": 1.0}
        ),
        "collection_errors": DetectorDefaults(
            detectors.collection_errors, {"max_fraction": 0.05, "min_rollouts": 16, "paid_only": 1.0}
        ),
        "tests_dropped": DetectorDefaults(
            detectors.dropped_tests, {"max_fraction": 0.02, "min_rollouts": 16, "paid_only": 1.0}
        ),
        "missing_behaviour": DetectorDefaults(behaviour.missing_behaviour, {"min_gap": 0.3, "min_episodes": 8}),
    },
    remedies={
        **{name: EXPLOIT_REMEDIES for name in ("test_tampering", "tests_dropped", "collection_errors")},
        # Dead groups under the all-or-nothing `correct`: pay the tests fixed of those failing (restored tests).
        "dead_outcome_groups": (partial_credit("tests_fixed", ("correct",)),),
        "missing_behaviour": (behaviour.BEHAVIOUR_BONUS,),
    },
    # SWE-bench's harness restores the test files before it runs them, so an edited or broken test no longer
    # reads as a pass: `tests_restored` scores the visible tests that way.
    audited_variants={"tests": ("tests_restored",), "correct": ("tests_restored",)},
)
