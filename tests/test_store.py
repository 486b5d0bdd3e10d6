"""The rollout store: round trip, metrics, atomic shards under a SIGKILLed writer, and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from evotrainer.store.rollouts import RolloutStore, reward_terms_named
from evotrainer.types import Rollout, Turn


def make_rollouts(step: int, n: int = 4, branch: str = "main") -> list[Rollout]:
    return [
        Rollout(
            id=f"{branch}-s{step:06d}-{i:04d}",
            run="r",
            branch=branch,
            step=step,
            harness_version="h-x",
            task_id=f"t{i}",
            split="train",
            group_id=f"g{i // 2}",
            prompt="1+1=\n",
            turns=[Turn("ask 1\n", 3, -0.5, "digit 1 is 2\n", False), Turn("<answer>2</answer>", 6, -0.1)],
            termination="stop",
            rewards={"correct": float(i % 2), "format": 1.0},
            reward=float(i % 2) + 0.1,
            audit=bool(i % 2),
            info={"answer": "2"},
        )
        for i in range(n)
    ]


def test_round_trip_and_queries(tmp_path):
    store = RolloutStore(tmp_path / "store")
    assert store.count() == 0 and store.query() == []
    store.append(make_rollouts(1), "main-s000001")
    store.append(make_rollouts(2), "main-s000002")
    store.append_metrics("r", "main", 1, {"reward": 0.5, "entropy": 1.2}, "main-s000001")
    assert store.reward_terms() == ["correct", "format"]
    rows = store.query(where="rewards['correct'] = 1", limit=10)
    assert [r["id"] for r in rows] == [
        "main-s000001-0001",
        "main-s000001-0003",
        "main-s000002-0001",
        "main-s000002-0003",
    ]
    r = rows[0]
    assert r["rewards"] == {"correct": 1.0, "format": 1.0} and r["audit"] is True and r["info"] == {"answer": "2"}
    assert r["turns"][0]["observation"] == "digit 1 is 2\n" and r["num_turns"] == 2 and r["completion_tokens"] == 9
    assert store.metrics("main") == {1: {"reward": 0.5, "entropy": 1.2}}
    # A clean diagnosis is on record too (a diagnosis row with zero findings).
    store.append_findings([], "s-x", "main-d000001-000002-s-x", "main", 1, 2)
    assert store.sql("SELECT count(*) AS n FROM findings")[0]["n"] == 0
    assert store.sql("SELECT branch, first_step, last_step, findings FROM diagnoses") == [
        {"branch": "main", "first_step": 1, "last_step": 2, "findings": 0}
    ]
    from evotrainer.diagnostics.revision import stored_findings

    assert stored_findings(store) == {("s-x", ("main", 1, 2)): []}
    # Re-writing a step's shard replaces it: no duplicated rollouts after a retried step.
    store.append(make_rollouts(2), "main-s000002")
    assert store.count() == 8


# Incompressible 8 kB prompts: a shard's bytes, and so the time its temporary file exists, outweigh building its
# rows. With the small rows alone the file lived for about a ten-thousandth of the writer's time, and a 60 s poll
# missed it (CI, 2026-11-27, twice).
WRITER = """
import os, sys
from dataclasses import replace
from tests.test_store import make_rollouts
from evotrainer.store.rollouts import RolloutStore, reward_terms_named
store = RolloutStore(sys.argv[1])
pad = [os.urandom(4096).hex() for _ in range(3000)]
step = 0
print("ready", flush=True)
while True:
    step += 1
    store.append([replace(r, prompt=p) for r, p in zip(make_rollouts(step, n=3000), pad)], f"main-s{step:06d}")
"""


def test_killed_writer_leaves_no_partial_shard(tmp_path):
    root = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert proc.stdout.readline().strip() == b"ready"
    deadline = time.time() + 60
    # Kill while a shard is being written: wait until a temporary file exists.
    while time.time() < deadline and not list((root / "rollouts").glob(".*.tmp")):
        time.sleep(0.005)
    assert list((root / "rollouts").glob(".*.tmp")), "the writer never started a shard"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    shards = sorted((root / "rollouts").glob("*.parquet"))
    for shard in shards:
        assert pq.read_table(shard).num_rows == 3000  # every visible shard is whole
    store = RolloutStore(root)  # reopening removes the dead writer's temporary file
    assert not list((root / "rollouts").glob(".*.tmp"))
    assert store.count() == 3000 * len(shards)
    assert store.sql("SELECT count(DISTINCT id) AS n FROM rollouts")[0]["n"] == 3000 * len(shards)


def test_rollouts_cli(tmp_path):
    run = tmp_path / "run"
    (run).mkdir()
    (run / "config.yaml").write_text("{}\n")
    RolloutStore(run / "store").append(make_rollouts(1), "main-s000001")
    env = {**os.environ}
    out = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "rollouts", str(run), "--where", "reward > 1", "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)  # one JSON document, not JSON lines
    assert [x["id"] for x in rows] == ["main-s000001-0001", "main-s000001-0003"]
    assert rows[0]["rewards"] == {"correct": 1.0, "format": 1.0}
    none = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "rollouts", str(run), "--where", "reward > 5", "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert none.returncode == 0 and json.loads(none.stdout) == []
    table = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "rollouts", str(run), "--limit", "2"],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
    )
    assert table.returncode == 0 and "main-s000001-0000" in table.stdout and "main-s000001-0002" not in table.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", "rollouts", str(run), "--where", "no_such_column > 1"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 2 and "no_such_column" in bad.stderr and "Traceback" not in bad.stderr
    # A misspelt reward term: DuckDB reads the missing key as NULL and would match nothing, silently.
    for where in ("rewards['corect'] = 1", "rewards.corect = 1", "element_at(rewards, 'corect') = 1"):
        typo = subprocess.run(
            [sys.executable, "-m", "evotrainer.cli", "rollouts", str(run), "--where", where, "--json"],
            capture_output=True,
            text=True,
            env=env,
        )
        assert typo.returncode == 2 and typo.stdout == "", where
        assert "'corect'" in typo.stderr and "correct, format" in typo.stderr and "Traceback" not in typo.stderr


def test_reward_terms_named_in_sql():
    sql = "rewards['format'] = 1 AND rewards.correct > 0 OR rewards.\"my term\" > 1 OR map_extract(rewards, 'it''s')"
    assert reward_terms_named(sql) == ["format", "correct", "my term", "it's"]
    assert reward_terms_named("reward > 0 AND split = 'train'") == []
