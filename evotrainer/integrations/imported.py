"""What every importer shares: another trainer's logged completions as our rollouts (groups, token counts,
terminations, the weighted reward) and the run directory they land in, which `diagnose`, `rollouts`, `backtest`
and `report` read as they read a `train` run's."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field

from evotrainer.errors import UserError
from evotrainer.harness.harness import Harness, save_harness
from evotrainer.ids import group_id, rollout_id, shard_id
from evotrainer.store.files import atomic_write_text
from evotrainer.store.rollouts import RolloutStore
from evotrainer.training.run import claim_run_dir
from evotrainer.types import Rollout, Turn

BRANCH = "main"
"""An imported run is one branch, named as a `train` run's (training.run.BRANCH), so `diagnose` reads it by default."""


class Sample(BaseModel):
    """One completion as the other trainer logged it."""

    step: int
    prompt: str
    completion: str
    rewards: dict[str, float]
    """Each reward term's value (NaN where the trainer logged none)."""
    info: dict[str, Any] = Field(default_factory=dict)
    """Whatever else the trainer logged with it (an advantage, a ground truth, extra columns)."""


class ImportRecord(BaseModel):
    """`import.json`: where an imported run came from and what could not be known from it."""

    source_format: Literal["trl", "verl", "trl-callback"]
    source: str
    files: list[str]
    steps: list[int]
    rollouts: int
    notes: list[str]
    """What the logs did not say and how it was filled in (token counts, terminations, weights)."""


def message_text(value: Any) -> str:
    """A prompt or completion as text: TRL's conversational `[{role, content}, ...]` reads as the local domain
    reads it (a lone message is its content; several are a `role: content` line each)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    messages = [m for m in value if isinstance(m, dict)]
    if len(messages) == 1:
        return str(messages[0].get("content", ""))
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)


def token_counts(texts: Sequence[str], tokenizer: Any | None) -> list[int]:
    """Each completion's length in the tokenizer's tokens, re-encoded from its text (the logs keep no ids), or in
    whitespace-separated words without a tokenizer."""
    if tokenizer is None:
        return [len(t.split()) for t in texts]
    return [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]


def terminations(tokens: Sequence[int], cap: int | None, clipped_share: float | None) -> list[str]:
    """`length` for the completions the token cap cut, `stop` for the rest. The trainer's own clipped share of
    the step, where it logged one, is the exact count: the longest that many are the cut ones (a re-encoded
    text can come out a token shorter than the ids it was sampled as). Else a count at the cap is cut."""
    n = len(tokens)
    if clipped_share is not None and math.isfinite(clipped_share):
        k = min(n, round(clipped_share * n))
        cut = set(sorted(range(n), key=lambda i: (-tokens[i], i))[:k])
        return ["length" if i in cut else "stop" for i in range(n)]
    if cap is None:
        return ["stop"] * n
    return ["length" if t >= cap else "stop" for t in tokens]


def weighted_reward(rewards: dict[str, float], weights: dict[str, float]) -> float:
    """The harness's total: the weighted sum of the terms it weights, a missing or NaN term counting 0 (TRL's
    nansum over reward functions)."""
    return float(sum(w * rewards[k] for k, w in weights.items() if k in rewards and math.isfinite(rewards[k])))


def task_id(prompt: str) -> str:
    """The same prompt is the same task across steps."""
    return "p-" + hashlib.sha256(prompt.encode()).hexdigest()[:12]


def step_rollouts(
    run: str, step: int, samples: Sequence[Sample], tokens: Sequence[int], ends: Sequence[str], harness: Harness
) -> list[Rollout]:
    """One step's samples as rollouts; a group is the step's completions of one prompt (in the order first seen)."""
    groups: dict[str, int] = {}
    out = []
    for i, (s, n, end) in enumerate(zip(samples, tokens, ends, strict=True)):
        g = groups.setdefault(s.prompt, len(groups))
        out.append(
            Rollout(
                id=rollout_id(BRANCH, step, i),
                run=run,
                branch=BRANCH,
                step=step,
                harness_version=harness.version,
                task_id=task_id(s.prompt),
                split="train",
                group_id=group_id(BRANCH, step, g),
                prompt=s.prompt,
                # No logprob is logged: None (NULL in the store), which the detectors read as unknown.
                turns=[Turn(action=s.completion, tokens=n, mean_logprob=None)],  # type: ignore[arg-type]
                termination=end,  # type: ignore[arg-type]
                rewards=dict(s.rewards),
                reward=weighted_reward(s.rewards, harness.reward_weights),
                info=s.info,
            )
        )
    return out


def group_size(samples: Sequence[Sample]) -> int:
    """The most common number of completions per (step, prompt): the run's num_generations."""
    sizes: dict[tuple[int, str], int] = {}
    for s in samples:
        sizes[(s.step, s.prompt)] = sizes.get((s.step, s.prompt), 0) + 1
    counts = list(sizes.values())
    return max(set(counts), key=lambda c: (counts.count(c), c)) if counts else 1


def open_run(run_dir: Path, harness: Harness, overwrite: bool) -> RolloutStore:
    """A new run directory with the harness the rollouts were scored under: config.yaml holds the run's name and
    that harness (what `harness show` and `backtest` read). A used directory is refused unless `overwrite`: two
    runs' rollouts in one store would read as one run."""
    if not overwrite and run_dir.is_dir() and any(run_dir.iterdir()):
        raise UserError(f"--run {run_dir}: already holds a run; name another run directory, or pass --overwrite")
    claim_run_dir(run_dir, overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "run": {"name": run_dir.name, "out_dir": str(run_dir.parent)},
        "harness": harness.model_dump(mode="json"),
    }
    atomic_write_text(
        run_dir / "config.yaml",
        "# An imported run (import.json says from where): only its harness is known.\n"
        + yaml.safe_dump(config, sort_keys=False),
    )
    save_harness(run_dir, harness)
    return RolloutStore(run_dir / "store")


def write_step(
    store: RolloutStore, rollouts: list[Rollout], metrics: dict[str, float] | None, run: str, step: int
) -> None:
    """One step's rollouts and the metrics the trainer logged for it, under the shard names a train run uses."""
    store.append(rollouts, shard_id(BRANCH, step))
    if metrics:
        store.append_metrics(run, BRANCH, step, metrics, shard_id(BRANCH, step))


def finish_run(run_dir: Path, harness: Harness, record: ImportRecord) -> dict[str, Any]:
    """import.json and summary.json: what was read, and the run's figures."""
    atomic_write_text(run_dir / "import.json", record.model_dump_json(indent=2))
    summary = {
        "run": run_dir.name,
        "imported_from": record.source_format,
        "source": record.source,
        "steps": max(record.steps, default=0),
        "rollouts": record.rollouts,
        "harness_version": harness.version,
        "notes": record.notes,
    }
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def imported(run_dir: Path) -> ImportRecord | None:
    """The import record of a run directory, or None for a run trained here."""
    path = run_dir / "import.json"
    return ImportRecord.model_validate_json(path.read_text()) if path.is_file() else None


def harness_for(
    weights: dict[str, float], num_generations: int, cap: int | None, knobs: dict[str, Any] | None = None
) -> tuple[Harness, list[str]]:
    """The harness an imported run is read under: its reward terms and weights, group size and token cap, and
    the further knobs (`section.name`) the source recorded; with the knobs our harness cannot hold at their
    values (left at our defaults), each as `section.name = value`."""
    raw: dict[str, Any] = {
        "reward_weights": weights,
        "sampling": {"num_generations": max(1, min(256, num_generations))},
    }
    if cap is not None:
        raw["sampling"]["max_completion_length"] = cap
    try:
        base = Harness.model_validate(raw)
    except ValueError as e:
        raise UserError(f"the imported run's reward terms, group size or token cap make no harness: {e}") from None
    dropped = []
    for path, value in (knobs or {}).items():
        section, _, name = path.partition(".")
        trial = {**raw, section: {**raw.get(section, {}), name: value}}
        try:
            base = Harness.model_validate(trial)
            raw = trial
        except ValueError:
            dropped.append(f"{path} = {value!r}")
    return base, dropped
