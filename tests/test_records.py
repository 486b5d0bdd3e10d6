"""The typed records and the id scheme: ids built and parsed by one module."""

from __future__ import annotations

from evotrainer.ids import EVAL, GATE, TRAIN, branch_id, group_id, parse_shard, rollout_id, shard_id, trial_id
from evotrainer.stages.race import arm_seed
from evotrainer.stages.results import SEED_STRIDE, Mainline


def test_ids_are_built_in_one_scheme_and_parsed_back():
    assert rollout_id("r01-seg", 3, 7) == "r01-seg-s000003-0007"
    assert rollout_id("r01-c1", 21, 12, EVAL) == "r01-c1-e000021-0012"
    assert group_id("r01-seg", 3, 2) == "r01-seg-s000003-g002"
    assert shard_id("r01-c2r", 40, GATE) == "r01-c2r-g000040"
    for name in (shard_id("r01-seg", 3), shard_id("final-r02-c1", 12, EVAL), shard_id("base", 0, EVAL)):
        assert shard_id(*parse_shard(name)) == name
    assert parse_shard("r01-seg-s000003") == ("r01-seg", 3, TRAIN)
    assert parse_shard("main-000001-000005-s1") is None  # `evotrainer diagnose`'s window files are no shards
    assert (branch_id(2, "replicate", 1), trial_id(2, 1)) == ("r02-c1r", "r02-t1")


def test_one_seed_stride_separates_arms_and_attempts():
    head = Mainline.model_construct(attempt=1)
    assert head.seed(5) == 5 + SEED_STRIDE * 1000
    assert arm_seed(5, "candidate", 2) - arm_seed(5, "control") == 3 * SEED_STRIDE
