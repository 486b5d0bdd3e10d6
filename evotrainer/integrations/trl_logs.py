"""The TRL importer: a GRPOTrainer run's logged completions and metrics as a run directory.

What TRL writes (trl 1.16.0, trl/trainer/grpo_trainer.py, GRPOTrainer.log): with `GRPOConfig(log_completions=True)`,
at every log, OUTPUT_DIR/completions/completions_{global_step:05d}.parquet with the latest generation batch, one row
per completion: `step`, `prompt`, `completion` (text, or TRL's conversational messages), one column per reward
function (named by its __name__, NaN where it returned None), the columns a reward function added by `log_extra`,
and `advantage`. Its metrics (`reward`, `entropy`, `kl`, `completions/clipped_ratio`, `rewards/NAME/mean`, ...) are
in the log history of trainer_state.json, which the Trainer writes into each checkpoint-N directory (and
OUTPUT_DIR on `save_state()`); our metric names are TRL's, so the detectors read them as they are."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.errors import UserError
from evotrainer.harness.harness import Harness
from evotrainer.integrations.imported import (
    ImportRecord,
    Sample,
    finish_run,
    group_size,
    harness_for,
    message_text,
    open_run,
    step_rollouts,
    terminations,
    token_counts,
    write_step,
)
from evotrainer.types import Rollout

COMPLETIONS = re.compile(r"^completions_(\d+)\.parquet$")
NOT_TERMS = frozenset({"step", "prompt", "completion", "advantage", "image", "images"})
"""The completion table's columns that are not reward functions (TRL writes `image` for multimodal runs)."""
EXPECTED = (
    "TRL's completion logs: completions/completions_STEP.parquet in the trainer's output_dir "
    "(GRPOConfig(log_completions=True) writes them), that completions/ directory, or one such file"
)


def completion_files(source: Path) -> list[Path]:
    """The completion tables of a TRL output_dir, its completions/ directory, or one table, by step."""
    if source.is_file():
        if source.suffix != ".parquet":
            raise UserError(f"{source}: not a Parquet file; expected {EXPECTED}")
        return [source]
    if not source.is_dir():
        raise UserError(f"{source}: no such file or directory; expected {EXPECTED}")
    d = source / "completions" if (source / "completions").is_dir() else source
    files = sorted((p for p in d.glob("completions_*.parquet") if COMPLETIONS.match(p.name)), key=_step_of)
    if not files:
        raise UserError(f"{source}: holds no completions_STEP.parquet; expected {EXPECTED}")
    return files


def _step_of(p: Path) -> int:
    m = COMPLETIONS.match(p.name)
    return int(m[1]) if m else 0


def output_dir(source: Path) -> Path:
    """The trainer's output_dir, from whichever of its parts was given."""
    d = source.parent if source.is_file() else source
    return d.parent if d.name == "completions" else d


def _state_files(root: Path) -> list[Path]:
    """trainer_state.json of the output_dir, then of its checkpoints, newest first."""
    checkpoints = sorted(root.glob("checkpoint-*/trainer_state.json"), key=lambda p: _number(p.parent.name))
    return [p for p in [root / "trainer_state.json", *reversed(checkpoints)] if p.is_file()]


def _number(name: str) -> int:
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else -1


def logged_metrics(root: Path) -> tuple[dict[int, dict[str, float]], Path | None]:
    """TRL's per-step metrics from the longest log history found, {step: {name: value}}, and its file."""
    best: tuple[list[dict], Path | None] = ([], None)
    for path in _state_files(root):
        history = json.loads(path.read_text()).get("log_history", [])
        if len(history) > len(best[0]):
            best = (history, path)
    out: dict[int, dict[str, float]] = {}
    for entry in best[0]:
        if "train_runtime" in entry or "step" not in entry:  # the closing summary is no step's
            continue
        m = {k: float(v) for k, v in entry.items() if k not in ("step", "epoch") and _number_like(v)}
        out.setdefault(int(entry["step"]), {}).update(m)
    return out, best[1]


def _number_like(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def find_tokenizer(root: Path, given: Path | None) -> tuple[Any | None, str]:
    """The tokenizer completions are counted in: the one given, else the one the Trainer saved with the model in
    the output_dir or its newest checkpoint; and where it came from ("" when there is none)."""
    from transformers import AutoTokenizer

    if given is not None:
        try:
            return AutoTokenizer.from_pretrained(str(given)), str(given)
        except (OSError, ValueError) as e:
            raise UserError(f"--tokenizer {given}: not a tokenizer directory ({str(e).splitlines()[0]})") from None
    checkpoints = sorted(root.glob("checkpoint-*/tokenizer_config.json"), key=lambda p: -_number(p.parent.name))
    for cfg in [root / "tokenizer_config.json", *checkpoints]:
        if cfg.is_file():
            return AutoTokenizer.from_pretrained(str(cfg.parent)), str(cfg.parent)
    return None, ""


def reward_terms(columns: Sequence[str], metrics: dict[int, dict[str, float]], types: dict[str, Any]) -> list[str]:
    """The reward functions' columns: those TRL logged a `rewards/NAME/mean` for, else the numeric columns (a
    numeric log_extra column is then read as a term too; the notes say so)."""
    logged = {k.split("/")[1] for m in metrics.values() for k in m if k.startswith("rewards/") and k.endswith("/mean")}
    if logged:
        return [c for c in columns if c in logged]
    return [c for c in columns if c not in NOT_TERMS and types.get(c) == "number"]


def samples_from_table(table: dict[str, list[Any]], terms: Sequence[str]) -> list[Sample]:
    """TRL's completion table (its columns as lists) as samples; a NaN reward (the function returned None) is
    left out of the rollout's terms."""
    n = len(table["prompt"])
    others = [c for c in table if c not in NOT_TERMS and c not in terms]
    out = []
    for i in range(n):
        rewards = {t: float(table[t][i]) for t in terms if _finite(table[t][i])}
        info = {c: table[c][i] for c in others}
        if "advantage" in table:
            info["advantage"] = table["advantage"][i]
        out.append(
            Sample(
                step=int(table["step"][i]),
                prompt=message_text(table["prompt"][i]),
                completion=message_text(table["completion"][i]),
                rewards=rewards,
                info=info,
            )
        )
    return out


def _finite(v: Any) -> bool:
    return _number_like(v) and math.isfinite(v)


def trl_step(
    run: str,
    step: int,
    samples: Sequence[Sample],
    harness: Harness,
    tokenizer: Any | None,
    metrics: dict[str, float],
    cap: int | None,
) -> list[Rollout]:
    """One logged generation batch as rollouts: token counts re-encoded, terminations by TRL's clipped share (else
    by the cap, where known)."""
    tokens = token_counts([s.completion for s in samples], tokenizer)
    ends = terminations(tokens, cap, metrics.get("completions/clipped_ratio"))
    return step_rollouts(run, step, samples, tokens, ends, harness)


def _read(path: Path) -> tuple[dict[str, list[Any]], dict[str, str]]:
    table = pq.read_table(path)
    types = {f.name: "number" if f.type.num_fields == 0 and _numeric(f.type) else "other" for f in table.schema}
    cols = table.to_pydict()
    if not {"step", "prompt", "completion"} <= set(cols):
        raise UserError(f"{path}: no step, prompt and completion columns; expected {EXPECTED}")
    return cols, types


def _numeric(t: Any) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def import_trl(
    source: Path,
    run_dir: Path,
    tokenizer: Path | None = None,
    max_completion_length: int | None = None,
    reward_weights: dict[str, float] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Read a TRL run's completion tables (and metrics, and tokenizer, where its output_dir has them) into a new
    run directory; the summary, with notes on what the logs did not say."""
    files = completion_files(source)
    root = output_dir(source)
    metrics, state = logged_metrics(root)
    tok, tok_from = find_tokenizer(root, tokenizer)
    tables = [_read(f) for f in files]
    terms = reward_terms(list(tables[0][0]), metrics, tables[0][1])
    if not terms:
        raise UserError(f"{files[0]}: no reward column (a numeric column besides step and advantage)")
    notes: list[str] = []
    batches: dict[int, list[Sample]] = {}
    last: list[tuple[str, str]] = []
    for f, (cols, _) in zip(files, tables):
        samples = samples_from_table(cols, terms)
        key = [(s.prompt, s.completion) for s in samples]
        if key == last:  # num_iterations or steps_per_generation > 1: the same batch logged at the next step
            notes.append(f"{f.name} repeats the batch before it (the same generation logged again): read once")
            continue
        last = key
        for s in samples:
            batches.setdefault(s.step, []).append(s)
    weights = _weights(terms, reward_weights, notes)
    cap = max_completion_length or _cap(metrics)
    harness, _ = harness_for(weights, group_size([s for b in batches.values() for s in b]), cap)
    notes += _notes(tok_from, cap, max_completion_length, metrics, state)
    store = open_run(run_dir, harness, overwrite)
    count = 0
    for step, samples in sorted(batches.items()):
        rollouts = trl_step(run_dir.name, step, samples, harness, tok, metrics.get(step, {}), cap)
        write_step(store, rollouts, metrics.get(step), run_dir.name, step)
        count += len(rollouts)
    record = ImportRecord(
        source_format="trl",
        source=str(source),
        files=[str(f) for f in files] + ([str(state)] if state else []),
        steps=sorted(batches),
        rollouts=count,
        notes=notes,
    )
    return finish_run(run_dir, harness, record)


def _weights(terms: list[str], given: dict[str, float] | None, notes: list[str]) -> dict[str, float]:
    """TRL's reward_weights are not in its logs: 1.0 each (TRL's default) unless given."""
    given = dict(given or {})
    if unknown := sorted(set(given) - set(terms)):
        raise UserError(
            f"--reward-weight {unknown[0]}: the run logged no such reward function; its terms: {', '.join(terms)}"
        )
    if set(given) != set(terms):
        notes.append(
            "reward weights are not in TRL's logs: "
            + ", ".join(f"{t} {given.get(t, 1.0):g}" for t in terms)
            + " (1.0 is TRL's default; --reward-weight NAME=W sets one)"
        )
    return {t: given.get(t, 1.0) for t in terms}


def _cap(metrics: dict[int, dict[str, float]]) -> int | None:
    """max_completion_length from the metrics: at a step where a completion was clipped, the longest completion
    is exactly the cap (generation stops there)."""
    caps = [m["completions/max_length"] for m in metrics.values() if m.get("completions/clipped_ratio", 0) > 0]
    return int(max(caps)) if caps and all(c == caps[0] for c in caps) else None


def _notes(
    tok_from: str, cap: int | None, given_cap: int | None, metrics: dict[int, dict[str, float]], state: Path | None
) -> list[str]:
    notes = [
        f"completion tokens re-encoded from the text with the tokenizer of {tok_from}"
        if tok_from
        else "no tokenizer found (--tokenizer DIR gives one): completion lengths are counted in words"
    ]
    if state is None:
        notes.append(
            "no trainer_state.json in the output_dir or its checkpoints: no step metrics (entropy, KL, clipped "
            "share), and terminations only from --max-completion-length"
        )
    elif metrics:
        notes.append(f"step metrics and each step's truncated share from {state}")
    if cap is None and not any("completions/clipped_ratio" in m for m in metrics.values()):
        notes.append("the token cap is unknown (--max-completion-length N gives it): every completion counts stopped")
    elif cap is not None and not given_cap:
        notes.append(f"max_completion_length {cap}, read from the longest completion of a step that clipped some")
    return notes
