"""The window a detector reads: DuckDB views over one branch's steps in the store, opened in place."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from evotrainer.diagnostics.detector import Window
from evotrainer.ids import parse_shard
from evotrainer.store.files import sql_str
from evotrainer.store.rollouts import METRIC_SCHEMA, ROLLOUT_SCHEMA, RolloutStore


def _window_shards(d: Path, branch: str, first_step: int, last_step: int) -> list[tuple[str, int | None]]:
    """(path, step its name says, or None) of each shard that may hold rows of the window. A shard whose name
    (ids.shard_id) says it holds another branch or a step outside the window is not opened; a name that does not
    parse is always read, and the SQL filter decides for its rows."""
    out = []
    for f in sorted(d.glob("*.parquet")):
        s = parse_shard(f.stem)
        if s and (s.branch != branch or not first_step <= s.step <= last_step):
            continue
        out.append((f.as_posix(), s.step if s else None))
    return out


def open_window(
    store: RolloutStore, branch: str, first_step: int, last_step: int, params: dict[str, float] | None = None
) -> Window:
    """A Window over one branch's steps first_step..last_step: views `rollouts` (train split) and
    `heldout` over the shards in place, `metrics` for the branch, and two tables:
    `rollout_stats`, the window's train rollouts without their text (id, step, group_id, termination,
    completion_tokens, num_turns, reward, rewards, audit, mean_logprob = mean over turns, tool_errors =
    turns with a tool error), materialized once because a dozen detectors each rescanning thousands of
    shards would cost up to a second apiece; and `shards` (path, step), the rollout shards of the
    window with the step their name says (NULL if it does not parse), so that a query for a few
    steps' text opens those shards only (builtin.recent_actions)."""
    con = duckdb.connect(":memory:")
    con.execute("SET parquet_metadata_cache = true")  # text samples and evidence rescan the same shard footers
    where = f"branch = {sql_str(branch)} AND step BETWEEN {int(first_step)} AND {int(last_step)}"
    for view, d, schema in (
        ("_window_rollouts", store.rollout_dir, ROLLOUT_SCHEMA),
        ("_window_metrics", store.metric_dir, METRIC_SCHEMA),
    ):
        shards = _window_shards(d, branch, first_step, last_step)
        if view == "_window_rollouts":
            con.register(
                "_shards",
                pa.table(
                    {
                        "path": pa.array([p for p, _ in shards], pa.string()),
                        "step": pa.array([s for _, s in shards], pa.int64()),
                    }
                ),
            )
            con.execute("CREATE TEMP TABLE shards AS SELECT * FROM _shards")
            con.unregister("_shards")
        if shards:
            files = "[" + ", ".join(sql_str(p) for p, _ in shards) + "]"
            con.execute(
                f"CREATE VIEW {view} AS SELECT * FROM read_parquet({files}, union_by_name = true) WHERE {where}"
            )
        else:
            con.register(f"{view}_empty", schema.empty_table())
            con.execute(f"CREATE VIEW {view} AS SELECT * FROM {view}_empty")
    con.execute("CREATE VIEW rollouts AS SELECT * FROM _window_rollouts WHERE split = 'train'")
    con.execute("CREATE VIEW heldout AS SELECT * FROM _window_rollouts WHERE split = 'heldout'")
    con.execute("CREATE TEMP TABLE metrics AS SELECT * FROM _window_metrics")
    con.execute(
        "CREATE TEMP TABLE rollout_stats AS SELECT id, step, group_id, termination, completion_tokens, num_turns, "
        "reward, rewards, audit, list_avg(list_transform(turns, lambda t: t.mean_logprob)) AS mean_logprob, "
        "len(list_filter(turns, lambda t: t.tool_error)) AS tool_errors FROM rollouts"
    )
    return Window(con=con, branch=branch, first_step=first_step, last_step=last_step, params=dict(params or {}))
