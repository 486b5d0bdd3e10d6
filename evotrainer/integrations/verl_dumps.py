"""The verl importer: the rollout dumps verl writes when `trainer.rollout_data_dir` is set, as a run directory.

What verl writes (volcengine/verl at b178a3cd, verl/trainer/ppo/ray_trainer.py, RayPPOTrainer._log_rollout_data and
_dump_generations): after each training step, ROLLOUT_DATA_DIR/{global_steps}.jsonl, one JSON object a line per
response of the batch: `input` and `output` (the prompt and response ids decoded with skip_special_tokens), `gts`
(the sample's reward_model.ground_truth), `score` (the sum of the response's token-level scores), `step`, and every
key of the reward function's extra infos that has one value per response (a dict-returning compute_score's keys,
e.g. `acc`, `pred`). The dump keeps neither the group id (`uid`) nor token ids: a group is the step's responses to
one prompt text, and lengths are re-encoded from the text."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from evotrainer.errors import UserError
from evotrainer.integrations.imported import (
    ImportRecord,
    Sample,
    finish_run,
    group_size,
    harness_for,
    open_run,
    step_rollouts,
    terminations,
    token_counts,
    write_step,
)
from evotrainer.integrations.trl_logs import find_tokenizer

DUMP = re.compile(r"^(\d+)\.jsonl$")
EXPECTED = (
    "verl's rollout dumps: files named STEP.jsonl (verl writes one per training step into trainer.rollout_data_dir)"
)


def dump_files(source: Path) -> list[tuple[int, Path]]:
    """(step, file) of each dump in a rollout_data_dir (or the one dump given), by step."""
    if source.is_file():
        m = DUMP.match(source.name)
        if not m:
            raise UserError(f"{source}: not a verl rollout dump (its name is not STEP.jsonl); expected {EXPECTED}")
        return [(int(m[1]), source)]
    if not source.is_dir():
        raise UserError(f"{source}: no such file or directory; expected {EXPECTED}")
    files = sorted((int(m[1]), p) for p in source.iterdir() if (m := DUMP.match(p.name)))
    if not files:
        raise UserError(f"{source}: holds no STEP.jsonl; expected {EXPECTED}")
    return files


def read_dump(path: Path, step: int) -> list[Sample]:
    """One dump's responses: `score` is the reward term `score`; every numeric extra info (a bool as 0/1) is a term
    of its own, carried unweighted; `gts` and the other extras are the rollout's info."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: not a JSON line ({e.msg}); expected {EXPECTED}") from None
        if missing := [k for k in ("input", "output", "score") if k not in row]:
            raise UserError(f"{path}:{n}: no {', '.join(missing)}; expected {EXPECTED}")
        rewards, info = {}, {}
        for k, v in row.items():
            if k in ("input", "output", "step"):
                continue
            if isinstance(v, bool | int | float) and math.isfinite(float(v)):
                rewards[k] = float(v)
            elif k != "score":
                info[k] = v
        out.append(Sample(step=step, prompt=row["input"], completion=row["output"], rewards=rewards, info=info))
    return out


def import_verl(
    source: Path,
    run_dir: Path,
    tokenizer: Path | None = None,
    max_response_length: int | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Read a rollout_data_dir into a new run directory; the summary, with notes on what the dumps did not say."""
    files = dump_files(source)
    batches = {step: read_dump(path, step) for step, path in files}
    tok, tok_from = find_tokenizer(source if source.is_dir() else source.parent, tokenizer)
    extras = sorted({k for b in batches.values() for s in b for k in s.rewards} - {"score"})
    harness, _ = harness_for({"score": 1.0}, group_size([s for b in batches.values() for s in b]), max_response_length)
    notes = [
        "the reward is verl's `score` (the sum of the token-level scores)"
        + (f"; the numeric extra infos {', '.join(extras)} are stored as unweighted terms" if extras else ""),
        "groups are each step's responses to the same prompt text (the dump keeps no uid)",
        f"response tokens re-encoded from the text with the tokenizer of {tok_from}"
        if tok_from
        else "no tokenizer given (--tokenizer DIR): response lengths are counted in words",
    ]
    if max_response_length is None:
        notes.append(
            "the token cap is unknown (--max-response-length N, verl's data.max_response_length, gives it): "
            "every response counts as stopped"
        )
    elif tok is None:
        notes.append("a response counts as cut when its word count reaches the cap: give --tokenizer for tokens")
    store = open_run(run_dir, harness, overwrite)
    count = 0
    for step, samples in sorted(batches.items()):
        tokens = token_counts([s.completion for s in samples], tok)
        ends = terminations(tokens, max_response_length, None)
        rollouts = step_rollouts(run_dir.name, step, samples, tokens, ends, harness)
        write_step(store, rollouts, None, run_dir.name, step)
        count += len(rollouts)
    record = ImportRecord(
        source_format="verl",
        source=str(source),
        files=[str(p) for _, p in files],
        steps=sorted(batches),
        rollouts=count,
        notes=notes,
    )
    return finish_run(run_dir, harness, record)
