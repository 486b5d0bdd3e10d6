"""What the LLM proposer reads: the instructions and output schema (SYSTEM), the brief rendered as text
(the harness with every knob's meaning and range, the findings, their evidence rollouts in full, step
metric trends, this run's trials and verdicts, matching skills), fitted to the context by leaving out
whole evidence rollouts, lowest priority first, and the feedback message of a re-ask."""

from __future__ import annotations

import json
import typing
from dataclasses import dataclass, field
from typing import Any

from evotrainer.diagnostics.agent import AGENT_DEFAULTS, TABLES
from evotrainer.harness.interventions import (  # the kinds' targets, so the prompt cannot drift from the schema
    _KIND_TARGETS,
    Kind,
)
from evotrainer.harness.knobs import Knob, registry
from evotrainer.proposers.llm_client import estimate_tokens
from evotrainer.proposers.proposer import Brief

_SEVERITY = {"critical": 0, "warning": 1, "info": 2}
MAX_SERIES = 40  # points per metric series; longer ones are thinned (first and last kept)
DELIM = "-----"  # around verbatim text, so a trajectory's own markdown cannot end a section

SYSTEM = (
    """You are the diagnostician and proposer of EvoTrainer, which post-trains a small language model with
reinforcement learning (GRPO) and evolves its training harness. Each round you read the evidence of the
last training segment and propose single-factor interventions on the harness. Each one is trained as a
candidate against a control for a few steps and an independent evaluator decides; you never see the
evaluator's tasks or its tests, only training rollouts (with the evaluator's audit on a sample of them).

Rules:
- One intervention changes exactly ONE knob. To change two knobs, propose two interventions.
- Values must lie in the knob's range; choices must be one of the listed ones.
- Do not repeat an intervention this run already tried under the same findings unless the evidence changed.
- Read the rollouts: say what the policy actually does, and cite rollout ids in each rationale.
- A high training reward the audit does not confirm is reward hacking: fix the reward, not the policy.

Intervention kinds and the knobs they may target:
"""
    + "\n".join(f"  {k}: {', '.join(_KIND_TARGETS[k])}" for k in typing.get_args(Kind))
    + f"""
remove_reward_term ignores value; remove_filter restores the knob's default; replace_reward_term moves the
weight of the target term to the term named by value (e.g. target reward_weights.tests, value tests_restored).

You may also write detectors: checks that flag rollouts, added to the diagnostic suite after validation
and a backtest against past verdicts. A detector is either
- "sql": one DuckDB SELECT over the tables {", ".join(TABLES)} (nothing else: no files, no other tables)
  that returns a column `id` of the rollouts it flags, most telling first. rollouts: id, step, task_id,
  group_id, prompt, turns (list of struct action, tokens, mean_logprob, observation, tool_error),
  num_turns, completion_tokens, max_action_tokens, termination, rewards (MAP term -> value), reward,
  audit (true / false / NULL when not audited), info (JSON text). rollout_stats: id, step, group_id,
  termination, completion_tokens, num_turns, reward, rewards, audit, mean_logprob, tool_errors.
  metrics: step, name, value.
- "python": source defining flag(rollout: dict) -> bool over the same rollout fields (turns as dicts,
  rewards as a dict, info parsed), run in a sandbox with the standard library only.
It fires when more than max_share (default {AGENT_DEFAULTS["max_share"]}) of the window's rollouts are flagged,
and at least min_matches (default {int(AGENT_DEFAULTS["min_matches"])}). validity: true only for rollouts whose reward
cannot be trusted; the audits must confirm it.

Answer with ONE JSON object and nothing else:
{{"diagnosis": "what the evidence shows, citing rollout ids",
 "interventions": [{{"kind": "set_knob", "target": "sampling.temperature", "value": 1.2,
   "hypothesis": {{"finding": "zero_variance_groups", "signal": "frac_reward_zero_std", "direction": "down",
     "rationale": "why, citing rollout ids"}}}}],
 "detectors": [{{"name": "short_snake_case", "sql": "SELECT id FROM rollouts WHERE ...", "severity": "warning",
   "validity": false, "knobs": ["reward_weights.format"], "message": "what flagged rollouts have in common"}}]}}
"detectors" may be empty. hypothesis.finding names the finding addressed (or "explore"); hypothesis.signal
names the metric that should move (a step metric below, or heldout/accuracy) and direction is up or down."""
)


def reply_schema(brief: Brief) -> dict[str, Any]:
    """The reply's JSON schema, for servers that constrain their output to one (response_format json_schema);
    detectors stay free-form objects (their checks are agent.parse's)."""
    return {
        "type": "object",
        "properties": {
            "diagnosis": {"type": "string"},
            "interventions": {
                "type": "array",
                "maxItems": brief.limit,
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": {"enum": list(typing.get_args(Kind))},
                        "target": {"type": "string"},
                        "value": {},
                        "hypothesis": {
                            "type": "object",
                            "properties": {
                                "finding": {"type": "string"},
                                "signal": {"type": "string"},
                                "direction": {"enum": ["up", "down"]},
                                "rationale": {"type": "string"},
                            },
                            "required": ["finding", "signal", "direction", "rationale"],
                        },
                    },
                    "required": ["kind", "target", "value", "hypothesis"],
                },
            },
            "detectors": {"type": "array", "items": {"type": "object"}},
        },
        "required": ["interventions"],
    }


@dataclass
class Rendered:
    """The user message, which evidence rollouts it shows and which it left out (and why)."""

    text: str
    shown: list[str]
    left_out: list[str]
    too_long: list[str] = field(default_factory=list)
    tokens: int = 0


def render(brief: Brief, budget_tokens: int) -> Rendered:
    """The brief as text within `budget_tokens` (estimated). Evidence rollouts are ranked: each
    finding's most telling rollout first (findings by severity, validity first), then each one's
    second, and so on, then context samples no finding cites. The lowest ranked are left out whole
    until the rest fit; the prompt says how many and which."""
    order = _ranked(brief)
    blocks = {i: _rollout(i, brief.evidence[i], _cited_by(brief, i)) for i in order}
    head = _head(brief)
    budget_chars = max(0, (budget_tokens - estimate_tokens(head) - 200) * 3)  # 200: the left-out note
    too_long = [i for i in order if len(blocks[i]) > budget_chars]
    kept = [i for i in order if i not in too_long]
    while kept and sum(len(blocks[i]) for i in kept) > budget_chars:
        kept.pop()
    left_out = [i for i in order if i not in kept]
    parts = [head, f"## Evidence rollouts ({len(kept)} of {len(order)} shown, in full)"]
    if left_out:
        parts.append(
            f"{len(left_out)} evidence rollout(s) left out to fit the context (lowest ranked first"
            + (f"; {len(too_long)} longer than the whole budget" if too_long else "")
            + "): "
            + ", ".join(left_out)
        )
    parts += [blocks[i] for i in kept]
    text = "\n\n".join(parts)
    return Rendered(text, kept, left_out, too_long, estimate_tokens(text))


def _ranked(brief: Brief) -> list[str]:
    findings = sorted(brief.findings, key=lambda f: (_SEVERITY[f.severity], not f.validity, f.name))
    lists = [[i for i in f.evidence if i in brief.evidence] for f in findings]
    order: list[str] = []
    for k in range(max((len(x) for x in lists), default=0)):
        order += [x[k] for x in lists if k < len(x) and x[k] not in order]
    return order + [i for i in brief.evidence if i not in order]


def _cited_by(brief: Brief, rid: str) -> list[str]:
    return [f.name for f in brief.findings if rid in f.evidence]


def _head(brief: Brief) -> str:
    """Everything of the prompt but the evidence rollouts: the task, knobs, findings, metrics, trials and skills."""
    out = [
        f"# Run {brief.run}, round {brief.round}, domain {brief.domain}",
        f"Propose up to {brief.limit} intervention(s), most promising first"
        + (
            f" (about {n} may explore knobs this run has not tried)."
            if (n := round(brief.limit * brief.explore))
            else "."
        ),
    ]
    out += _knob_lines(brief)
    out += _finding_lines(brief)
    out += _metric_lines(brief)
    out += _trial_lines(brief)
    out += _skill_lines(brief)
    return "\n".join(out)


def _knob_lines(brief: Brief) -> list[str]:
    """The harness section: every knob with its current value, default, range or choices and meaning."""
    h = brief.harness
    out = [
        f"## Harness {h.version}: every knob (current value, default, range or choices, replayable = a cheap "
        "replay can score it before a trial; meaning)"
    ]
    current = h.model_dump(mode="json")
    terms = sorted({t for r in brief.evidence.values() for t in (r.get("rewards") or {})} | set(h.reward_weights))
    for k in registry():
        if k.path == "suite_version":
            continue  # not an intervention target: the suite evolves through revision, not proposals
        if k.path == "reward_weights.*":
            out.append(
                f"- reward_weights.TERM = {json.dumps(h.reward_weights)} (terms on rollouts: {', '.join(terms)}; "
                f"replayable): {k.meaning}"
            )
            continue
        section, _, name = k.path.partition(".")
        out.append(
            f"- {k.path} = {json.dumps(current[section][name])} (default {json.dumps(k.default, default=list)}, "
            f"{_knob_range(k)}{', replayable' if k.replayable else ''}): {k.meaning}"
        )
    return out


def _knob_range(k: Knob) -> str:
    """A knob's allowed values as text: its choices, its bounds, or its type when it has neither."""
    return (
        f"choices {list(k.choices)}"
        if k.choices
        else f"range {_num(k.low)}..{_num(k.high)}"
        if k.low is not None and k.high is not None
        else f">= {_num(k.low)}"
        if k.low is not None
        else f"<= {_num(k.high)}"
        if k.high is not None
        else k.type
    )


def _finding_lines(brief: Brief) -> list[str]:
    """The findings section: each finding (severity, validity, value, knobs, steps, message) and its evidence ids."""
    out = [f"## Findings of the diagnostic suite (signature {list(brief.signature)})"]
    if not brief.findings:
        out.append("None fired on this segment.")
    for f in sorted(brief.findings, key=lambda f: (_SEVERITY[f.severity], not f.validity, f.name)):
        shown = [i for i in f.evidence if i in brief.evidence]
        withheld = len(f.evidence) - len(shown)
        out.append(
            f"- {f.name} [{f.severity}{', validity' if f.validity else ''}] value {f.value:.4g} vs threshold "
            f"{f.threshold:.4g}; knobs {', '.join(f.knobs)}; steps {f.first_step}-{f.last_step}. {f.message} "
            f"Evidence: {', '.join(shown) or 'none'}"
            + (f" ({withheld} cited id(s) not training rollouts: withheld)" if withheld else "")
        )
    return out


def _metric_lines(brief: Brief) -> list[str]:
    """The step metrics section: each series, thinned to MAX_SERIES points."""
    out = ["## Step metrics of the segment (step: value)"]
    if not brief.metrics:
        out.append("None recorded.")
    for name, series in brief.metrics.items():
        pts = _thin(series)
        out.append(
            f"- {name}: "
            + ", ".join(f"{s}: {v:.4g}" for s, v in pts)
            + (f" (thinned from {len(series)} points)" if len(pts) < len(series) else "")
        )
    return out


def _trial_lines(brief: Brief) -> list[str]:
    """The trials section: this run's interventions so far and their verdicts."""
    out = [
        "## Trials of this run so far (intervention -> verdict; "
        "effect = candidate minus control accuracy on the evaluator's gate tasks)"
    ]
    if not brief.history:
        out.append("None yet.")
    for t in brief.history:
        iv = t.intervention
        eff = f"{t.effect:+.3f}" if t.effect is not None else "n/a"
        out.append(
            f"- round {t.round}: {iv.describe()} for {iv.hypothesis.finding} under signature {list(t.signature)} -> "
            f"{t.decision}, effect {eff}" + (f", reasons: {', '.join(t.reasons)}" if t.reasons else "")
        )
    return out


def _skill_lines(brief: Brief) -> list[str]:
    """The skills section: skills from earlier runs whose signature matches, with their record; then the changes
    earlier runs lost on this very harness near this step (the screen refuses them)."""
    out = ["## Skills from earlier runs whose signature matches"]
    if not brief.skills:
        out.append("None.")
    if brief.losses:
        out.append("Rejected by earlier runs on this harness, near this step (proposing them again is refused):")
    for t in brief.losses:
        eff = f"{t.effect:+.3f}" if t.effect is not None else "n/a"
        out.append(f"- {t.intervention.describe()} in run {t.run} at step {t.step}, effect {eff}")
    for s in brief.skills:
        out.append(
            f"- {s.skill_id}: {s.intervention.describe()} (signature {list(s.signature)}, "
            f"similarity {s.similarity:.2f}; "
            f"{s.wins} won, {s.losses} lost, mean effect {s.mean_effect:+.3f}"
            f"{', quarantined' if s.quarantined else ''}; domains {', '.join(s.domains)})"
        )
    return out


def _rollout(rid: str, r: dict[str, Any], cited_by: list[str]) -> str:
    audit = {True: "passed", False: "FAILED", None: "not audited"}[r.get("audit")]
    rewards = ", ".join(f"{k}={v:.4g}" for k, v in sorted((r.get("rewards") or {}).items()))
    lines = [
        f"### rollout {rid}"
        + (f" (evidence of {', '.join(cited_by)})" if cited_by else " (a context sample: no finding cites it)"),
        f"task {r.get('task_id')}, step {r.get('step')}, group {r.get('group_id')}, difficulty {r.get('difficulty')}; "
        f"termination {r.get('termination')}; reward {r.get('reward', float('nan')):.4g} ({rewards}); audit {audit}; "
        f"{r.get('completion_tokens')} completion tokens in {r.get('num_turns')} turn(s)",
        f"{DELIM} prompt {DELIM}",
        str(r.get("prompt", "")),
    ]
    for k, t in enumerate(r.get("turns") or [], 1):
        lines += [
            f"{DELIM} turn {k} action ({t.get('tokens')} tokens, mean logprob {_num(t.get('mean_logprob'))}"
            f"{', TOOL ERROR' if t.get('tool_error') else ''}) {DELIM}",
            str(t.get("action") or ""),
        ]
        if t.get("observation"):
            lines += [f"{DELIM} turn {k} observation {DELIM}", str(t["observation"])]
    if r.get("info"):
        lines += [f"{DELIM} info {DELIM}", json.dumps(r["info"], sort_keys=True, default=str)]
    lines.append(f"{DELIM} end of {rid} {DELIM}")
    return "\n".join(lines)


def _thin(series: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if len(series) <= MAX_SERIES:
        return list(series)
    stride = (len(series) - 1) / (MAX_SERIES - 1)
    return [series[round(k * stride)] for k in range(MAX_SERIES)]


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e9:
        return str(int(v))
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def feedback(
    errors: list[str], refusals: list[str], accepted: list[str], detector_errors: list[str], limit: int
) -> str:
    """The one re-ask of a round: what could not be used and why, and what was accepted."""
    parts = ["Your reply could not be used as it stands."]
    if errors:
        parts.append("It is not valid output: " + "; ".join(errors))
    if refusals:
        parts.append("These interventions were refused:\n" + "\n".join(f"- {r}" for r in refusals))
    if detector_errors:
        parts.append("These detectors were refused:\n" + "\n".join(f"- {d}" for d in detector_errors))
    if accepted:
        parts.append("Accepted already (no need to repeat them): " + "; ".join(accepted))
    parts.append(
        f"Answer again with ONE JSON object in the same format: up to {limit - len(accepted)} more intervention(s), "
        "each changing exactly one knob within its range, and any corrected detectors."
    )
    return "\n\n".join(parts)
