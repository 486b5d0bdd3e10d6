"""Evidence rollouts in the report: links to them, their text opened in place under a finding (`<details>`: prompt,
each turn's action and observation, reward terms, audit), and every cited rollout in full at the end of the page,
the target of the links."""

from __future__ import annotations

from typing import Any

from evotrainer.report.svg import esc
from evotrainer.store.files import sql_list
from evotrainer.store.rollouts import RolloutStore


def link(rid: str) -> str:
    return f'<a href="#r-{esc(rid)}"><code>{esc(rid)}</code></a>'


def read_rollouts(store: RolloutStore, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The stored rollouts of these ids, by id (an id the store lacks is absent)."""
    ids = list(dict.fromkeys(ids))
    return {r["id"]: r for r in store.query(f"id IN {sql_list(ids)}")} if ids else {}


def _rewards(r: dict[str, Any]) -> str:
    rw = r["rewards"] if isinstance(r["rewards"], dict) else {x["term"]: x["value"] for x in r["rewards"]}
    return ", ".join(f"{k}={v:.2f}" for k, v in rw.items())


def _head(r: dict[str, Any]) -> str:
    return (
        f"<span class=muted>{esc(r['split'])}, task {esc(r['task_id'])}, termination {esc(r['termination'])}, "
        f"reward {r['reward']:.3f} ({esc(_rewards(r))}), audit {esc(r['audit'])}</span>"
    )


def _transcript(r: dict[str, Any]) -> str:
    turns = "".join(
        f"<b>action</b> {esc(t['action'])}\n"
        + (f"<b>observation</b> {esc(t['observation'])}\n" if t["observation"] else "")
        for t in r["turns"]
    )
    return f"<pre>{esc(r['prompt'].rstrip())}\n{turns}</pre>"


def opened(ids: list[str], rollouts: dict[str, dict[str, Any]], what: str) -> str:
    """A `<details>` that opens the text of each of these rollouts in place (prompt, turns, reward terms, audit);
    "" when the store holds none of them."""
    found = [rollouts[i] for i in ids if i in rollouts]
    if not found:
        return ""
    body = "".join(f"<div class=ev><code>{esc(r['id'])}</code> {_head(r)}{_transcript(r)}</div>" for r in found)
    return f"<details><summary>{esc(what)}: the {len(found)} evidence rollout(s)</summary>{body}</details>"


def evidence_section(rollouts: dict[str, dict[str, Any]], cited: list[str]) -> list[str]:
    """Every cited rollout in full, in citing order, as the target of the links above."""
    parts = ['<h2 id="evidence">Evidence rollouts</h2>']
    for rid in dict.fromkeys(cited):
        if (r := rollouts.get(rid)) is not None:
            parts.append(f'<div id="r-{esc(rid)}"><h4><code>{esc(rid)}</code> {_head(r)}</h4>{_transcript(r)}</div>')
    return parts
