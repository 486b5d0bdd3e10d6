"""The lineage as a picture: the mainline a horizontal spine with one column per round (the round's segment, then
the arm training continued from), the round's other arms as a short comb below its fork point, promotions and
rollbacks marked. Its width grows by a column a round, never by a step a branch, so a long run stays readable
(past the page's width it scrolls inside its own box). Each mark links to its round's section of the page."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evotrainer.report.svg import KIND_COLOURS, MAINLINE, PROMOTE, REJECT, esc, line, svg, text

COL, LEFT, SPINE, ARM_DY = 54, 46, 58, 17


@dataclass
class RoundShape:
    """One round's branches as the lineage draws them: the segment the arms fork from, the arms, the branch the
    mainline continued from after it (None while the round is unfinished) and how it got there."""

    round: int
    segment: dict[str, Any] | None
    arms: list[dict[str, Any]] = field(default_factory=list)
    head: str | None = None
    promoted: str | None = None
    rolled_back_to: str | None = None


def shapes(branches: list[dict[str, Any]], results: dict[tuple[int, str], Any]) -> list[RoundShape]:
    """Each round's shape, from the ledger's branches and its promote results."""
    out: dict[int, RoundShape] = {}
    for b in branches:
        if b["round"] == 0:
            continue
        s = out.setdefault(b["round"], RoundShape(b["round"], None))
        if b["kind"] == "segment":
            s.segment = b
        else:
            s.arms.append(b)
    for rnd, s in out.items():
        if (p := results.get((rnd, "promote"))) is not None:
            # `promoted` names the trial; the branch it promoted is the head training continues from.
            s.head, s.promoted = p.head.branch, p.head.branch if p.promoted else None
            s.rolled_back_to = p.rejected.rolled_back_to if p.rejected else None
    return [out[r] for r in sorted(out)]


def mainline(rounds: list[RoundShape]) -> list[str]:
    """The branches training went through, in order: each round's segment and the arm it continued from."""
    path = ["base"]
    for s in rounds:
        if s.segment:
            path.append(s.segment["id"])
        if s.head and s.head not in path:
            path.append(s.head)
    return path


def round_href(b: dict[str, Any]) -> str:
    """Where a branch's mark links: its round's section (the base, of no round, to the lineage)."""
    return f"#round-{b['round']}" if b["round"] > 0 else "#lineage"


def _acc(b: dict[str, Any]) -> str:
    a = b.get("heldout_accuracy")
    return "" if a is None else f"{a:.3f}".lstrip("0")


def _tip(b: dict[str, Any], note: str = "") -> str:
    acc = f", held-out {b['heldout_accuracy']:.3f}" if b.get("heldout_accuracy") is not None else ""
    return (
        f"{b['id']} ({b['kind']}): steps {b['first_step']}-{b['last_step']}, harness {b['harness_version']}, "
        f"suite {b['suite_version']}{acc}{note}"
    )


def _node(b: dict[str, Any], x: float, y: float, r: float, fill: str, ring: str = "", note: str = "") -> str:
    stroke = f' stroke="{ring}" stroke-width="2.5"' if ring else ' stroke="#fff" stroke-width="1"'
    return (
        f'<a href="{round_href(b)}"><circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}"{stroke}>'
        f"<title>{esc(_tip(b, note))}</title></circle></a>"
    )


def _arm(s: RoundShape, b: dict[str, Any], i: int, fork: float, decision: dict[str, str]) -> list[str]:
    """One arm that training did not continue from: an elbow down from the fork, a dot, its short name and
    held-out accuracy; a rejected candidate in red, a promoted one (rolled back) ringed."""
    y = SPINE + ARM_DY * (i + 1)
    x = fork + 11
    verdict = decision.get(b["id"], "")
    colour = KIND_COLOURS.get(b["kind"], "#000")
    ring = REJECT if verdict == "reject" else PROMOTE if verdict == "promote" else ""
    short = b["id"].split("-", 1)[-1]
    out = [line(fork, y - ARM_DY, fork, y, "#bbb"), line(fork, y, x, y, "#bbb")]
    out.append(_node(b, x, y, 4, colour, ring, f"; verdict {verdict}" if verdict else ""))
    out.append(text(x + 6, y + 3.5, f"{short} {_acc(b)}", 9, fill=REJECT if verdict == "reject" else "#333"))
    return out


def _round(
    s: RoundShape, x0: float, pos: dict[str, tuple[float, float]], decision: dict[str, str], after_rollback: bool
) -> list[str]:
    """One column: the segment on the spine (drawn from an earlier column by an arc after a rollback), its arms
    below, the head on the spine, the marks above."""
    out = [text(x0 + COL / 2, 12, f"r{s.round}", 10, "middle", fill="#555")]
    fork = x0 + 10
    if s.segment:
        seg = s.segment
        px, py = pos.get(seg["parent"], (x0 - COL / 2, SPINE))
        if after_rollback:
            out.append(
                f'<path d="M{px:.1f},{SPINE - 6} C{px + 10:.1f},{SPINE - 34} {fork - 10:.1f},{SPINE - 34} '
                f'{fork:.1f},{SPINE - 6}" fill="none" stroke="{REJECT}" stroke-width="1.5" stroke-dasharray="3,2">'
                f"<title>{esc(seg['id'])} trains from {esc(seg['parent'])}: the mainline rolled back</title></path>"
            )
        else:
            out.append(line(px, SPINE, fork, SPINE, MAINLINE, 3))
        out.append(_node(seg, fork, SPINE, 4.5, KIND_COLOURS["segment"]))
        pos[seg["id"]] = (fork, SPINE)
    below = [b for b in s.arms if b["id"] != s.head]
    for i, b in enumerate(below):
        out += _arm(s, b, i, fork, decision)
        pos[b["id"]] = (fork + 11, SPINE + ARM_DY * (i + 1))
    head = next((b for b in s.arms if b["id"] == s.head), None)
    hx = x0 + COL - 8
    if head is not None:
        out.append(line(fork, SPINE, hx, SPINE, MAINLINE, 3))
        promoted = s.promoted == head["id"]
        out.append(_node(head, hx, SPINE, 6 if promoted else 4.5, PROMOTE if promoted else KIND_COLOURS["control"]))
        out.append(text(hx, SPINE - 10, _acc(head), 9, "middle", fill="#333"))
        if promoted:
            out.append(
                f'<path d="M{hx - 5:.1f},{SPINE - 30} l5,-8 l5,8 z" fill="{PROMOTE}">'
                f"<title>round {s.round}: {esc(head['id'])} promoted (harness {esc(head['harness_version'])})"
                "</title></path>"
            )
        pos[head["id"]] = (hx, SPINE)
    if s.rolled_back_to:
        out.append(
            f"<g><title>round {s.round}: the mainline rolled back to {esc(s.rolled_back_to)}</title>"
            + text(hx, SPINE - 10, "rollback", 9, "middle", fill=REJECT, font_weight="bold")
            + "</g>"
        )
    return out


LEGEND = [
    ("segment", "mainline segment"),
    ("control", "control"),
    ("candidate", "candidate"),
    ("replicate", "candidate on fresh seeds"),
    ("control_replicate", "control replicate"),
    ("aa", "A-A arm"),
]


def lineage_svg(rounds: list[RoundShape], base: dict[str, Any] | None, decision: dict[str, str]) -> str:
    """The whole picture; `decision` is each candidate branch's verdict (promote / reject)."""
    depth = max((len([b for b in s.arms if b["id"] != s.head]) for s in rounds), default=0)
    width = LEFT + COL * max(len(rounds), 1) + 20
    height = SPINE + ARM_DY * (depth + 1) + 34
    out: list[str] = []
    pos: dict[str, tuple[float, float]] = {"base": (LEFT - 16, SPINE)}
    if base is not None:
        out.append(_node(base, LEFT - 16, SPINE, 5, KIND_COLOURS["base"]))
        out.append(text(LEFT - 16, SPINE + 16, "base", 9, "middle", fill="#333"))
    for i, s in enumerate(rounds):
        out += _round(s, LEFT + COL * i, pos, decision, i > 0 and rounds[i - 1].rolled_back_to is not None)
    ly = height - 10
    lx = 4.0
    for kind, label in LEGEND:
        out.append(f'<circle cx="{lx + 4:.1f}" cy="{ly - 3}" r="4" fill="{KIND_COLOURS[kind]}"/>')
        out.append(text(lx + 11, ly, label, 9, fill="#333"))
        lx += 18 + 5.2 * len(label)
    out.append(f'<path d="M{lx:.1f},{ly + 1} l5,-8 l5,8 z" fill="{PROMOTE}"/>')
    out.append(text(lx + 14, ly, "promoted", 9, fill="#333"))
    out.append(f'<circle cx="{lx + 70:.1f}" cy="{ly - 3}" r="4" fill="#fff" stroke="{REJECT}" stroke-width="2.5"/>')
    out.append(text(lx + 78, ly, "rejected", 9, fill="#333"))
    out.append(text(lx + 128, ly, "numbers: held-out accuracy on the gate tasks", 9, fill="#666"))
    return svg(max(width, lx + 340), height, out, "lineage: the mainline by round, with each round's arms")
