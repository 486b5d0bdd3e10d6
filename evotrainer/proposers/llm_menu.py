"""The compact brief for a small model (`llm.brief: compact`, or `auto` with a context of 8k tokens or less): the
findings in a few lines, one short evidence rollout each, this run's verdicts, and a numbered menu of the
catalog's candidate interventions to choose from. A model of a hundred million parameters cannot write a valid
intervention from a 6,000-token brief (tried: repetitive prose, no JSON); choosing by number it can, and its
choice still goes through the same screen and trial as any proposal."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from evotrainer.harness.interventions import Intervention
from evotrainer.proposers.heuristic import HeuristicProposer
from evotrainer.proposers.proposer import Brief

MENU_SIZE = 8  # options offered; the round still trials at most brief.limit of them
ACTION_CHARS = 300  # of each evidence rollout's action shown

MENU_SYSTEM = """You tune the training harness of a small language model trained with reinforcement learning.
Read the findings about its last training segment and choose the most promising interventions from the numbered
menu. Answer with ONE JSON object and nothing else, for example:
{"choose": [{"option": 2, "rationale": "why, citing a rollout id"}, {"option": 5, "rationale": "why"}]}"""


@dataclass(frozen=True)
class Menu:
    text: str
    options: list[Intervention]


def menu_options(brief: Brief, seed: int) -> list[Intervention]:
    """The catalog's candidates for this round (skills, remedies for the findings, exploration), screened as
    every proposal is, up to MENU_SIZE."""
    out = HeuristicProposer(seed).propose(replace(brief, limit=MENU_SIZE, explore=0.25))
    return [p.intervention for p in out.proposals]


def render_menu(brief: Brief, options: list[Intervention]) -> Menu:
    lines = [f"Choose up to {brief.limit} of the options below, most promising first.", "", "Findings:"]
    if not brief.findings:
        lines.append("- none fired on this segment")
    for f in brief.findings:
        lines.append(f"- {f.name} ({f.severity}): {f.message}")
    shown = [i for f in brief.findings for i in f.evidence[:1] if i in brief.evidence][:3]
    if shown:
        lines += ["", "Evidence (one rollout per finding, its first action cut to a few lines):"]
        for rid in shown:
            lines.append(f"- {rid}: {_short(brief.evidence[rid])}")
    if brief.history:
        lines += ["", "Tried in this run:"]
        for t in brief.history[-6:]:
            lines.append(f"- round {t.round}: {t.intervention.describe()} -> {t.decision}")
    lines += ["", "Options:"]
    for k, iv in enumerate(options, 1):
        lines.append(f"{k}. {iv.describe()} (for {iv.hypothesis.finding}: {iv.hypothesis.rationale})")
    return Menu("\n".join(lines), options)


def _short(r: dict[str, Any]) -> str:
    turns = r.get("turns") or []
    action = " ".join(str((turns[0] if turns else {}).get("action", "")).split())[:ACTION_CHARS]
    return (
        f"reward {r.get('reward', float('nan')):.3g}, audit {r.get('audit')}, termination {r.get('termination')}; "
        f'action "{action}"'
    )


def chosen(obj: dict[str, Any] | None, menu: Menu) -> tuple[list[tuple[Intervention, str]], list[str]]:
    """The options a reply chose ({"choose": [{"option": n, "rationale": s}, ...]}, or bare numbers), in its
    order, each with its rationale; and what could not be read."""
    if obj is None:
        return [], []
    picks, errors = [], []
    for k, item in enumerate(obj.get("choose") or []):
        n, why = (item.get("option"), str(item.get("rationale", ""))) if isinstance(item, dict) else (item, "")
        if isinstance(n, str) and n.strip().isdigit():
            n = int(n)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= len(menu.options):
            errors.append(f"choose[{k}]: {n!r} is not an option number 1..{len(menu.options)}")
            continue
        picks.append((menu.options[n - 1], why[:400]))
    return picks, errors


OPTION_RE = re.compile(r'"?option"?\s*[:=]\s*"?(\d+)')


def salvage(text: str, menu: Menu) -> tuple[dict[str, Any] | None, str]:
    """What a reply that is not valid JSON chose, as a reply object with how it was read; None when nothing.
    The option numbers it names after `"option":` (a small model's JSON often breaks after its first choice);
    else the options whose text it quotes whole, in the order it quotes them (SmolLM2-135M, asked for JSON,
    answers "The most promising interventions are: 1. set_knob optimizer.learning_rate: 1e-05 -> 3e-05 ...",
    copying some options and inventing others: the copied ones are the menu's, the rest is not read)."""
    found = [int(n) for n in OPTION_RE.findall(text or "")]
    if found:
        return {"choose": list(dict.fromkeys(found))}, "option numbers read from a reply that is not valid JSON"
    at = {}
    for n, iv in enumerate(menu.options, start=1):
        # A whole option: not the prefix of a longer value ("-> 3e-05" inside "-> 3e-055").
        m = re.search(re.escape(iv.describe()) + r"(?!\w|\.\d)", text or "")
        if m:
            at[n] = m.start()
    if not at:
        return None, ""
    return {"choose": sorted(at, key=at.get)}, "options quoted whole in a reply that is not JSON"


def menu_schema(n_options: int, limit: int) -> dict[str, Any]:
    """The reply's JSON schema, for servers that constrain their output to one (response_format json_schema)."""
    return {
        "type": "object",
        "properties": {
            "choose": {
                "type": "array",
                "maxItems": limit,
                "items": {
                    "type": "object",
                    "properties": {
                        "option": {"type": "integer", "minimum": 1, "maximum": n_options},
                        "rationale": {"type": "string"},
                    },
                    "required": ["option", "rationale"],
                },
            }
        },
        "required": ["choose"],
    }
