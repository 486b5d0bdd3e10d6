"""`evotrainer report RUN` for a run without a ledger (a `train` run, an imported one, a TRL callback's): one
self-contained HTML file with where the run came from, its step metrics, the findings of each diagnosis stored
with it linked to their evidence rollouts, and those rollouts' text."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from evotrainer.store.files import atomic_write_text, sql_list
from evotrainer.store.rollouts import RolloutStore

CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}\n"
    "table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;vertical-align:top}th{background:#f3f3f3}\n"
    "pre{background:#f7f7f7;padding:6px;white-space:pre-wrap;font-size:12px}.muted{color:#777}code{font-size:12px}"
    ".critical{color:#a00;font-weight:bold}"
)
METRICS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completions/clipped_ratio",
    "completions/mean_length",
    "entropy",
    "kl",
    "grad_norm",
    "loss",
    "eval/accuracy",
)
"""The step metrics shown, where the run logged them (TRL's names, which ours are)."""


def _e(x: Any) -> str:
    return html.escape(str(x))


def write_run_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    store = RolloutStore(run_dir / "store")
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    parts = [
        f"<!doctype html><meta charset=utf-8><title>EvoTrainer run {_e(run_dir.name)}</title><style>{CSS}</style>",
        f"<h1>EvoTrainer run <code>{_e(run_dir.name)}</code></h1>",
        _origin(summary, store),
        *_metrics(store),
    ]
    cited: list[str] = []
    parts += _findings(store, cited)
    parts += _evidence(store, cited)
    return atomic_write_text(run_dir / "report.html", "\n".join(parts))


def _origin(summary: dict[str, Any], store: RolloutStore) -> str:
    n = store.count()
    if "imported_from" in summary:
        notes = "".join(f"<li>{_e(x)}</li>" for x in summary.get("notes", []))
        return (
            f"<p>Imported from {_e(summary['imported_from'])} (<code>{_e(summary['source'])}</code>): {n} rollouts "
            f"of {summary['steps']} step(s), read under harness <code>{_e(summary['harness_version'])}</code>.</p>"
            + (f"<ul>{notes}</ul>" if notes else "")
        )
    if "accuracy_after" in summary:
        return (
            f"<p>{summary['steps']} RL step(s); held-out accuracy <b>{summary['accuracy_before']:.3f} &rarr; "
            f"{summary['accuracy_after']:.3f}</b>; harness <code>{_e(summary['harness_version'])}</code>; "
            f"{n} rollouts stored.</p>"
        )
    return f"<p>{n} rollouts stored; the run has not finished (no summary.json).</p>"


def _metrics(store: RolloutStore) -> list[str]:
    steps = store.metrics()
    names = [m for m in METRICS if any(m in row for row in steps.values())]
    if not names:
        return ["<h2>Step metrics</h2><p class=muted>The run logged none.</p>"]
    head = "".join(f"<th>{_e(m)}</th>" for m in names)
    rows = "".join(
        f"<tr><td>{s}</td>" + "".join(f"<td>{row[m]:.4g}</td>" if m in row else "<td></td>" for m in names) + "</tr>"
        for s, row in sorted(steps.items())
    )
    return [f"<h2>Step metrics</h2><table><tr><th>step</th>{head}</tr>{rows}</table>"]


def _findings(store: RolloutStore, cited: list[str]) -> list[str]:
    """Each stored diagnosis (window and suite version), newest window first, with its findings."""
    windows = store.sql(
        "SELECT DISTINCT suite_version, branch, first_step, last_step, findings FROM diagnoses "
        "ORDER BY last_step DESC, first_step, suite_version"
    )
    parts = ["<h2>Findings</h2>"]
    if not windows:
        parts.append("<p class=muted>No diagnosis yet: <code>evotrainer diagnose RUN</code> runs the suite.</p>")
    for w in windows:
        rows = store.sql(
            "SELECT * FROM findings WHERE suite_version = ? AND branch = ? AND first_step = ? AND last_step = ? "
            "ORDER BY name",
            [w["suite_version"], w["branch"], w["first_step"], w["last_step"]],
        )
        parts.append(
            f"<h3>{_e(w['branch'])} steps {w['first_step']}-{w['last_step']}, suite "
            f"<code>{_e(w['suite_version'])}</code>: {w['findings']} finding(s)</h3>"
        )
        if not rows:
            continue
        parts.append(
            "<table><tr><th>finding</th><th>severity</th><th>value</th><th>threshold</th><th>message</th>"
            "<th>evidence</th><th>knobs</th></tr>"
        )
        for f in rows:
            cited += f["evidence"]
            links = " ".join(f'<a href="#r-{_e(i)}">{_e(i)}</a>' for i in f["evidence"])
            parts.append(
                f"<tr><td class={_e(f['severity'])}>{_e(f['name'])}</td><td>{_e(f['severity'])}</td>"
                f"<td>{f['value']:.4g}</td><td>{f['threshold']:.4g}</td><td>{_e(f['message'])}</td><td>{links}</td>"
                f"<td>{_e(', '.join(f['knobs']))}</td></tr>"
            )
        parts.append("</table>")
    return parts


def _evidence(store: RolloutStore, cited: list[str]) -> list[str]:
    """Every cited rollout in full, as the target of the links above."""
    ids = list(dict.fromkeys(cited))
    if not ids:
        return []
    parts = ["<h2>Evidence rollouts</h2>"]
    for r in store.query(f"id IN {sql_list(ids)}"):
        turns = "".join(
            f"<b>action</b> {_e(t['action'])}\n"
            + (f"<b>observation</b> {_e(t['observation'])}\n" if t["observation"] else "")
            for t in r["turns"]
        )
        rewards = ", ".join(f"{k}={v:.3g}" for k, v in r["rewards"].items())
        parts.append(
            f'<div id="r-{_e(r["id"])}"><h4><code>{_e(r["id"])}</code> <span class=muted>step {r["step"]}, '
            f"termination {_e(r['termination'])}, {r['completion_tokens']} tokens, reward {r['reward']:.3f} "
            f"({_e(rewards)})</span></h4><pre>{_e(r['prompt'])}\n{turns}</pre></div>"
        )
    return parts
