"""The claims' aggregate: every domain's cells into benchmarks/results/claims.json (accuracies per arm and
seed, the loop against the reference with both intervals, promotions, plants, skills) and the main table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.claims.arms import ACROSS_FROM, DOMAINS, MAIN_ARMS
from benchmarks.claims.records import (
    Cell,
    DomainClaims,
    OverBase,
    SkillPair,
    Skills,
    SkillsMet,
    machine_of,
    mixed_machines,
    read_cell,
)
from benchmarks.intervals import PairedInterval, SeedT, paired_interval, read_margin, verdict
from benchmarks.manifest import results_in, write_result
from benchmarks.tables import markdown_table, mean_and_seeds

WARM_ARMS = ("loop_default_warm", "loop_default_across", "loop_default_project")
SKILLS_TARGET = 0.70
"""The warm-skills claim: a warm run reaches the cold run's final with at most this share of its tokens."""

Key = tuple[str, str, int]


def planted_counts(cells: list[Cell]) -> dict[str, Any]:
    outcomes = [p.outcome for c in cells for p in c.planted]
    return {
        "invalid_planted": len(outcomes),
        "invalid_promoted": sum(o.startswith("promote") for o in outcomes),
        "invalid_outcomes": outcomes,
    }


def tokens_to_reach(trajectory: list[tuple[int, float]], target: float) -> int | None:
    return next((int(tok) for tok, acc in trajectory if acc >= target), None)


def domain_claims(by: dict[Key, Cell], domain: str, full: list[int]) -> DomainClaims:
    """One domain over the seeds `full` (those with every main arm)."""
    arms: dict[str, list] = {a: [by[domain, a, s].accuracy for s in full] for a in MAIN_ARMS}
    arms["base"] = [by[domain, "base", s].accuracy if (domain, "base", s) in by else None for s in full]
    read = [by[domain, a, s] for a in (*MAIN_ARMS, "base") for s in full if (domain, a, s) in by]

    def versus(a: str, b: str):
        return paired_interval([by[domain, a, s].outcomes for s in full], [by[domain, b, s].outcomes for s in full])

    vs_ref = versus("loop_default", "static_reference")
    loop, ref = [by[domain, "loop_default", s] for s in full], [by[domain, "static_reference", s] for s in full]
    return DomainClaims(
        budget_tokens=by[domain, "loop_default", full[0]].budget_tokens,
        seeds=full,
        evaluator_hashes=sorted({c.evaluator_hash for c in read}),
        stale_seeds=[s for s in full if len({c.evaluator_hash for c in read if c.seed == s}) > 1],
        **arms,
        loop_default_vs_reference=vs_ref,
        loop_reference_vs_reference=versus("loop_reference", "static_reference"),
        loop_default_over_reference=float(np.mean(arms["loop_default"]) / np.mean(arms["static_reference"])),
        **at_reference(vs_ref.seed_t, loop, ref),
        promoted={
            a: [{"seed": s, **p} for s in full for p in by[domain, a, s].promoted]
            for a in ("loop_default", "loop_reference")
        },
        **planted_counts([by[domain, "planted", s] for s in full if (domain, "planted", s) in by]),
    )


def skills(by: dict[Key, Cell]) -> Skills | None:
    """Cold and warm loop runs (warm: with the cold run's library, or across: with another domain's): the tokens
    each took to reach the cold run's final accuracy, strictly and within one read's noise."""
    warm = [(by[d, "loop_default", s], by[d, a, s]) for (d, a, s) in by if a in WARM_ARMS]
    if not warm:
        return None
    pairs = [skill_pair(cold, hot) for cold, hot in warm]
    reached = [p for p in pairs if p.warm_tokens is not None]  # a warm run that never reached it: none
    groups = {
        d + {"loop_default_warm": "", "loop_default_across": " (across)"}.get(a, " (project)"): [
            i for i, (c, h) in enumerate(warm) if (c.domain, h.arm) == (d, a)
        ]
        for d, a in sorted({(c.domain, h.arm) for c, h in warm})
    }
    return Skills(
        cold_tokens=sum(p.cold_tokens for p in pairs),
        warm_tokens=sum(p.warm_tokens for p in reached) if len(reached) == len(pairs) else None,
        pairs=pairs,
        warm_vs_cold={
            key: paired_interval([warm[i][1].outcomes for i in ix], [warm[i][0].outcomes for i in ix])
            for key, ix in groups.items()
            if len(ix) >= 2
        },
        met={key: skills_met([pairs[i] for i in ix]) for key, ix in groups.items()},
    )


def skill_pair(cold: Cell, hot: Cell) -> SkillPair:
    # The cold final is one read: a run whose later reads sit a standard error under it got there all the same, so
    # "reached" is also read within that noise, for both runs alike (HISTORY.md, "Do warm runs reach ...?").
    margin = read_margin(cold.accuracy, len(cold.outcomes))
    return SkillPair(
        domain=cold.domain,
        seed=cold.seed,
        cold_final=cold.accuracy,
        cold_tokens=tokens_to_reach(cold.trajectory, cold.accuracy),
        warm_tokens=tokens_to_reach(hot.trajectory, cold.accuracy),
        warm_final=hot.accuracy,
        arm=hot.arm,
        library_from=ACROSS_FROM[hot.domain] if hot.arm == "loop_default_across" else None,
        margin=margin,
        cold_tokens_within=tokens_to_reach(cold.trajectory, cold.accuracy - margin),
        warm_tokens_within=tokens_to_reach(hot.trajectory, cold.accuracy - margin),
    )


def ratio(warm: int | None, cold: int | None) -> float | None:
    return None if warm is None or not cold else warm / cold


def skills_met(pairs: list[SkillPair]) -> SkillsMet:
    within = [ratio(p.warm_tokens_within, p.cold_tokens_within) for p in pairs]
    under = sum(r is not None and r <= SKILLS_TARGET for r in within)
    return SkillsMet(
        seeds=[p.seed for p in pairs],
        strict=[ratio(p.warm_tokens, p.cold_tokens) for p in pairs],
        within=within,
        within_at_or_under=under,
        met=2 * under > len(pairs),
    )


def over_base(by: dict[Key, Cell], domain: str) -> dict[str, Any]:
    """Each main arm against the base on the seeds with both cells (at least two: a seed-level interval)."""
    out = {}
    for arm in MAIN_ARMS:
        seeds = sorted(s for (d, a, s) in by if d == domain and a == arm and (domain, "base", s) in by)
        if len(seeds) < 2:
            continue
        cells, base = [by[domain, arm, s] for s in seeds], [by[domain, "base", s] for s in seeds]
        out[arm] = OverBase(
            seeds=seeds,
            arm=[c.accuracy for c in cells],
            base=[c.accuracy for c in base],
            vs_base=paired_interval([c.outcomes for c in cells], [c.outcomes for c in base]),
        ).model_dump(mode="json")
    return out


def loop_vs_reference(by: dict[Key, Cell], domain: str) -> dict[str, Any] | None:
    """The loop from the default against the static reference on the seeds with both cells (at least two), for a
    domain whose other main arms were not run (swe_short_300k: a budget variant measured for that claim alone)."""
    ref = "static_reference"
    seeds = sorted(s for (d, a, s) in by if (d, a) == (domain, "loop_default") and (domain, ref, s) in by)
    if len(seeds) < 2:
        return None
    loop, static = [by[domain, "loop_default", s] for s in seeds], [by[domain, ref, s] for s in seeds]
    interval = paired_interval([c.outcomes for c in loop], [c.outcomes for c in static])
    return {
        "seeds": seeds,
        "loop_default": [c.accuracy for c in loop],
        ref: [c.accuracy for c in static],
        "loop_default_vs_reference": interval.model_dump(mode="json"),
        **at_reference(interval.seed_t, loop, static),
    }


def at_reference(t: SeedT, loop: list[Cell], ref: list[Cell]) -> dict[str, Any]:
    """The margin (one standard error of one final read of the reference, on the fewest tasks a seed's pair
    shares) and what the loop's seed-level interval against the reference, `t`, shows within it."""
    tasks = min(len(set(a.outcomes) & set(b.outcomes)) for a, b in zip(loop, ref, strict=True))
    margin = read_margin(float(np.mean([c.accuracy for c in ref])), tasks)
    return {"margin": margin, "verdict": verdict(t, margin)}


def aggregate(cells: list[Cell]) -> dict[str, Any]:
    """claims.json's content: per domain with a full seed, its DomainClaims; `partial`: for a domain without one,
    the loop from the default against the reference where two seeds have both; then `skills` if any warm run;
    `over_base`: each arm against the untrained base, wherever two seeds have both (complete or not)."""
    by = {(c.domain, c.arm, c.seed): c for c in cells}
    out: dict[str, Any] = {}
    for domain in DOMAINS:
        seeds = sorted({s for (d, a, s) in by if d == domain and a in MAIN_ARMS})
        full = [s for s in seeds if all((domain, a, s) in by for a in MAIN_ARMS)]
        if full:
            out[domain] = domain_claims(by, domain, full).model_dump(mode="json")
    partial = {d: o for d in DOMAINS if d not in out and (o := loop_vs_reference(by, d))}
    if partial:
        out["partial"] = partial
    bases = {d: o for d in DOMAINS if (o := over_base(by, d))}
    if bases:
        out["over_base"] = bases
    if (sk := skills(by)) is not None:
        out["skills"] = sk.model_dump(mode="json")
    return out


def write_claims(cells_dir: Path, out: Path) -> dict[str, Any]:
    """Aggregate the cells of `cells_dir` into `out` (and its manifest); refused, before anything is written, where
    cells of one seed ran on several machines (records.mixed_machines)."""
    paths = results_in(cells_dir)
    cells = [read_cell(p) for p in paths]
    if why := mixed_machines([(c, machine_of(p)) for c, p in zip(cells, paths)]):
        raise SystemExit(f"{cells_dir}: {why}")
    claims = aggregate(cells)
    inputs = [p.name for p in paths]
    write_result(
        out,
        claims,
        indent=1,
        no_config=True,
        note=f"aggregated from {len(inputs)} cells in {cells_dir.name}/ (each with its own manifest)",
    )
    return claims


def table(out: dict[str, Any]) -> str:
    """The main table as Markdown: each arm's mean accuracy (per seed in brackets), the loop's difference from
    the reference with both intervals, the promotions and the plants."""
    header = [
        "domain",
        "base",
        "static default",
        "static reference",
        "loop from default",
        "loop from reference",
        "loop default - reference",
        "[95% two-level bootstrap]",
        "[95% seed t]",
        "loop default / reference",
        "planted (promoted)",
    ]
    rows = []
    for domain in DOMAINS:
        if domain not in out:
            continue
        d = DomainClaims.model_validate(out[domain])
        if d.stale_seeds:
            rows.append([domain, f"seeds {d.stale_seeds} read by several evaluators: stale cells, not compared"])
            continue
        iv = d.loop_default_vs_reference
        rows.append(
            [
                domain,
                mean_and_seeds(d.base),
                mean_and_seeds(d.static_default),
                mean_and_seeds(d.static_reference),
                mean_and_seeds(d.loop_default),
                mean_and_seeds(d.loop_reference),
                f"{iv.delta:+.3f}",
                f"[{iv.ci_low:+.3f}, {iv.ci_high:+.3f}]",
                seed_t_text(iv.seed_t, d.margin, d.verdict),
                f"{d.loop_default_over_reference:.2f}x",
                f"{d.invalid_planted} ({d.invalid_promoted})",
            ]
        )
    rows += [partial_row(domain, p, out.get("over_base", {})) for domain, p in out.get("partial", {}).items()]
    return markdown_table(header, rows)


def partial_row(domain: str, p: dict[str, Any], bases: dict[str, Any]) -> list[str]:
    """A domain measured for the loop against the reference alone (loop_vs_reference): its row of the main table,
    with the base where the same seeds have one and `-` for the arms not run."""
    iv = PairedInterval.model_validate(p["loop_default_vs_reference"])
    base = bases.get(domain, {}).get("loop_default", {})
    loop, ref = p["loop_default"], p["static_reference"]
    return [
        f"{domain} (loop and reference only)",
        mean_and_seeds(base["base"]) if base.get("seeds") == p["seeds"] else "-",
        "-",
        mean_and_seeds(ref),
        mean_and_seeds(loop),
        "-",
        f"{iv.delta:+.3f}",
        f"[{iv.ci_low:+.3f}, {iv.ci_high:+.3f}]",
        seed_t_text(iv.seed_t, p.get("margin"), p.get("verdict")),
        f"{np.mean(loop) / np.mean(ref):.2f}x",
        "-",
    ]


def skills_table(out: dict[str, Any]) -> str:
    """The warm-skills claim as Markdown: per domain and warm arm, the warm run's share of the cold run's tokens to
    the cold final at each seed, read strictly and within one read's noise, and whether the target is met."""
    header = ["warm runs", "seeds", "strictly", "within one read's noise", f"at most {SKILLS_TARGET:.0%}"]

    def shares(xs: list[float | None]) -> str:
        return " / ".join("never" if x is None else f"{x:.0%}" for x in xs)

    rows = [
        [key, " ".join(map(str, m.seeds)), shares(m.strict), shares(m.within),
         f"{m.within_at_or_under} of {len(m.seeds)}: {'met' if m.met else 'not met'}"]
        for key, m in Skills.model_validate(out["skills"]).met.items()
    ] if "skills" in out else []  # fmt: skip
    return markdown_table(header, rows)


def seed_t_text(t: SeedT, margin: float | None = None, shows: str | None = None) -> str:
    """The seed-level interval, and what it shows within the margin where the aggregate carries one."""
    text = "-" if t.ci_low is None else f"[{t.ci_low:+.3f}, {t.ci_high:+.3f}] (df {t.df})"
    return text if margin is None else f"{text}: {shows} within {margin:.3f}"
