"""Built-in detectors of the learning signal, length, entropy and the optimizer: plain functions over a
Window, aggregated in DuckDB; thresholds come from window.params (defaults: suite.CORE)."""

from __future__ import annotations

import math
import zlib
from collections import Counter
from typing import Any, NamedTuple

from evotrainer.diagnostics.detector import Finding, Window, finding, ids

# A rollout is "gibberish" when most of its action characters fall outside this set. Printable ASCII
# plus whitespace: the envs here are English and math; a domain in another script should raise
# `max_odd_chars` rather than trust this set.
_NORMAL = frozenset(chr(c) for c in range(0x20, 0x7F)) | frozenset("\n\t\r")


# -- shared helpers (validity.py and the code domain's detectors use them too) ---------------------------------
class Thirds(NamedTuple):
    """The first and the last third of the steps a source covers: a trend compares the two."""

    first_end: int
    """The last step of the first third."""
    last_start: int
    """The first step of the last third."""

    def early(self, aggregate: str) -> str:
        """An SQL aggregate over the first third's rows."""
        return f"{aggregate} FILTER (WHERE step <= {int(self.first_end)})"

    def late(self, aggregate: str) -> str:
        """An SQL aggregate over the last third's rows."""
        return f"{aggregate} FILTER (WHERE step >= {int(self.last_start)})"

    def compare(self, w: Window, aggregates: list[str], source: str = "rollout_stats") -> tuple[tuple, tuple]:
        """Each aggregate over the first third and over the last third of `source` (one scan):
        ((early values...), (late values...))."""
        cols = [self.early(a) for a in aggregates] + [self.late(a) for a in aggregates]
        row = w.con.execute(f"SELECT {', '.join(cols)} FROM {source}").fetchone()
        return tuple(row[: len(aggregates)]), tuple(row[len(aggregates) :])


def thirds(w: Window, source: str = "rollout_stats", args: list[Any] | None = None) -> Thirds | None:
    """The thirds of the steps `source` covers, or None below 3 distinct steps. Thirds of the observed span,
    not of the window bounds, so a window that is only partly filled still compares its early and late
    rollouts."""
    lo, hi, n = w.con.execute(
        f"SELECT min(step), max(step), count(DISTINCT step) FROM {source}", args or []
    ).fetchone()
    if not n or n < 3:
        return None
    k = max(1, (hi - lo + 1) // 3)
    return Thirds(lo + k - 1, hi - k + 1)


def recent_actions(w: Window, n: int) -> list[dict[str, Any]]:
    """The action texts of the window's last `n` train rollouts (newest first). Text checks run in
    Python (DuckDB's RE2 has no backreferences, so "the same chunk again" is not a regex), and only
    on this bounded sample: the latest rollouts are the policy's current behaviour, and reading them
    opens a few shards (the `shards` table of the window) instead of every action of the window."""
    cut = w.scalar(
        "SELECT coalesce(max(step) FILTER (WHERE c >= ?), min(step)) FROM "
        "(SELECT step, sum(count(*)) OVER (ORDER BY step DESC) AS c FROM rollout_stats GROUP BY step)",
        [n],
    )
    if cut is None:
        return []
    paths = [
        r[0]
        for r in w.con.execute(
            "SELECT path FROM shards WHERE step IS NULL OR step >= ? ORDER BY path", [cut]
        ).fetchall()
    ]
    if not paths:
        return []
    # The same rows as the `rollouts` view (branch, train split, window steps), read from those shards only.
    return w.rows(
        "SELECT id, step, reward, completion_tokens, list_transform(turns, lambda t: t.action) AS actions, "
        "list_avg(list_transform(turns, lambda t: t.mean_logprob)) AS mean_logprob "
        "FROM read_parquet(?, union_by_name = true) WHERE branch = ? AND split = 'train' AND step BETWEEN ? AND ? "
        "ORDER BY step DESC, id DESC LIMIT ?",
        [paths, w.branch, max(cut, w.first_step), w.last_step, n],
    )


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


# -- learning signal ------------------------------------------------------------------------------------
def zero_variance_groups(w: Window) -> list[Finding]:
    """Groups whose rewards are all equal give every rollout a zero advantage: no gradient. A high
    share (TRL's `frac_reward_zero_std`) means the tasks are all solved or all hopeless at this
    group size and temperature. Compared with a threshold, not == 0, so float noise cannot hide it."""
    p = w.params
    # A group of one counts as dead: it has no spread by construction (num_generations = 1).
    total, dead, dead_mean, lo, hi = w.con.execute(
        "SELECT count(*), count(*) FILTER (WHERE sd < ?), avg(mu) FILTER (WHERE sd < ?), min(mu), max(mu) FROM "
        "(SELECT group_id, stddev_pop(reward) AS sd, avg(reward) AS mu FROM rollout_stats "
        " GROUP BY group_id)",
        [p["std_threshold"]] * 2,
    ).fetchone()
    if not total or dead / total <= p["max_fraction"]:
        return []
    share = dead / total
    # One rollout from each of the latest dead groups: eight groups say more than one group eight times.
    ev = ids(
        w,
        "SELECT min(id) FROM rollout_stats GROUP BY group_id HAVING stddev_pop(reward) < ? "
        "ORDER BY max(step) DESC, group_id",
        [p["std_threshold"]],
    )
    return [
        finding(
            w,
            "zero_variance_groups",
            "critical" if share >= 0.95 else "warning",
            share,
            p["max_fraction"],
            ev,
            # Dead groups of solved prompts call for skipping them or drawing others (dynamic sampling);
            # dead groups of hopeless ones, for leaving those out.
            (
                "filters.dynamic_sampling",
                "curriculum.easy_threshold" if dead_mean >= (lo + hi) / 2 else "curriculum.hard_threshold",
                "sampling.temperature",
                "sampling.num_generations",
                "filters.zero_std_threshold",
            ),
            f"{_pct(share)} of groups ({dead}/{total}) have reward std < {p['std_threshold']:g} (mean reward of "
            f"those groups {dead_mean:.3f}), so their advantages are zero.",
        )
    ]


def plateau(w: Window) -> list[Finding]:
    """The per-step `reward` is flat over many steps while still below the ceiling: training has
    stalled (no signal, too low a learning rate, or tasks out of reach)."""
    p = w.params
    slope, n, mean = w.con.execute(
        "SELECT regr_slope(value, step), count(*), avg(value) FROM metrics WHERE name = 'reward' AND isfinite(value)"
    ).fetchone()
    if n < p["min_steps"] or slope is None or abs(slope) >= p["min_slope"] or mean >= p["ceiling"]:
        return []
    ev = ids(
        w,
        "SELECT id FROM rollout_stats WHERE step = (SELECT max(step) FROM rollout_stats) "
        "ORDER BY reward, completion_tokens DESC, id",
    )
    return [
        finding(
            w,
            "plateau",
            "warning",
            abs(slope),
            p["min_slope"],
            ev,
            ("optimizer.learning_rate", "sampling.temperature", "loss.entropy_coef"),
            f"Reward is flat over {n} steps (slope {slope:+.2e}/step, |slope| < {p['min_slope']:g}) at mean "
            f"{mean:.3f}, below the ceiling {p['ceiling']:g}.",
        )
    ]


# -- length -------------------------------------------------------------------------------------------
def truncation(w: Window) -> list[Finding]:
    """Rollouts cut by the token cap (termination `length`, TRL `completions/clipped_ratio`) never reach
    an answer; many of them mean the cap is too low or the policy rambles, and their zero reward is
    not about the task."""
    p = w.params
    n, cut, cut_len, ok_len = w.con.execute(
        "SELECT count(*), count(*) FILTER (WHERE termination = 'length'), avg(completion_tokens) FILTER "
        "(WHERE termination = 'length'), avg(completion_tokens) FILTER (WHERE termination <> 'length') "
        "FROM rollout_stats"
    ).fetchone()
    if not n or cut / n <= p["max_fraction"]:
        return []
    share = cut / n
    ev = ids(
        w, "SELECT id FROM rollout_stats WHERE termination = 'length' ORDER BY completion_tokens DESC, step DESC, id"
    )
    other = f"{ok_len:.1f}" if ok_len is not None else "n/a"
    return [
        finding(
            w,
            "truncation",
            "critical" if share >= 0.5 else "warning",
            share,
            p["max_fraction"],
            ev,
            (
                "sampling.max_completion_length",
                "loss.mask_truncated_completions",
                "shaping.overlong_buffer_len",
                "multi_turn.max_observation_tokens",
            ),
            f"{_pct(share)} of rollouts ({cut}/{n}) hit the token cap (mean {cut_len:.1f} tokens vs {other} "
            f"for the rest).",
        )
    ]


def length_blowup(w: Window) -> list[Finding]:
    """Mean completion length grows fast while the clipped share rises with it: the length is not
    converging, which precedes a reward collapse (more reuse epochs and length-biased losses feed it)."""
    p = w.params
    t = thirds(w)
    if t is None:
        return []
    (len0, clip0), (len1, clip1) = t.compare(w, ["avg(completion_tokens)", "avg((termination = 'length')::DOUBLE)"])
    growth = len1 / max(len0, 1e-9)
    if growth <= p["max_growth"] or clip1 <= clip0:
        return []
    ev = ids(
        w,
        "SELECT id FROM rollout_stats WHERE step >= ? ORDER BY (termination = 'length') DESC, "
        "completion_tokens DESC, step DESC, id",
        [t.last_start],
    )
    return [
        finding(
            w,
            "length_blowup",
            "warning",
            growth,
            p["max_growth"],
            ev,
            ("loss.num_iterations", "shaping.overlong_buffer_len", "loss.loss_type"),
            f"Mean completion length grew {growth:.2f}x ({len0:.1f} -> {len1:.1f} tokens, first to last third) "
            f"while the clipped share rose {_pct(clip0)} -> {_pct(clip1)}.",
        )
    ]


def repetition(w: Window) -> list[Finding]:
    """Actions stuck in a loop: one chunk repeated many times (word 3-grams, or characters when the
    text has few words), or a long action that zlib compresses far below normal text. Loops inflate
    length and often still earn reward, so they survive training."""
    p = w.params
    sample = recent_actions(w, int(p["sample_size"]))
    if not sample:
        return []
    loops = []
    for r in sample:
        score = _repetitiveness(
            "\n".join(a or "" for a in r["actions"] or []),
            int(p["min_repeats"]),
            p["min_dup_fraction"],
            p["max_compression"],
        )
        if score is not None:
            loops.append((score, r))
    share = len(loops) / len(sample)
    if share <= p["max_fraction"]:
        return []
    loops.sort(key=lambda x: (-x[0], -x[1]["completion_tokens"], x[1]["id"]))
    reward = sum(r["reward"] for _, r in loops) / len(loops)
    return [
        finding(
            w,
            "repetition",
            "warning",
            share,
            p["max_fraction"],
            [r["id"] for _, r in loops],
            ("shaping.overlong_buffer_len", "sampling.temperature", "shaping.length_penalty"),
            f"{_pct(share)} of the latest {len(sample)} rollouts ({len(loops)}) repeat a chunk over and over "
            f"(their mean reward {reward:.3f}).",
        )
    ]


def _repetitiveness(text: str, min_repeats: int, min_dup_fraction: float, max_compression: float) -> float | None:
    """How loop-like a text is (share of its 3-grams that repeat an earlier one), or None if it is not.
    Both a count and a share are required: "the answer is" four times in a long derivation is normal."""
    words = text.split()
    units = words if len(words) >= 3 + min_repeats else list("".join(words))
    grams = Counter(tuple(units[i : i + 3]) for i in range(len(units) - 2))
    total = sum(grams.values())
    if total:
        top = max(grams.values())
        dup = (total - len(grams)) / total
        if top >= min_repeats and dup >= min_dup_fraction:
            return dup
    raw = text.encode()
    # Below a few hundred bytes zlib's own overhead dominates the ratio; the n-gram test covers short text.
    if len(raw) >= 256:
        ratio = len(zlib.compress(raw, 6)) / len(raw)
        if ratio < max_compression:
            return 1.0 - ratio
    return None


# -- entropy ------------------------------------------------------------------------------------------
def _entropy_thirds(w: Window) -> tuple[float, float] | None:
    src = "(SELECT step, value FROM metrics WHERE name = 'entropy' AND isfinite(value))"
    t = thirds(w, src)
    if t is None:
        return None
    (e0,), (e1,) = t.compare(w, ["avg(value)"], src)
    return e0, e1


def most_confident(w: Window) -> list[str]:
    """The latest step's rollouts, most confident first (highest mean log-probability): what a collapse cites."""
    return ids(
        w,
        "SELECT id FROM rollout_stats WHERE step = (SELECT max(step) FROM rollout_stats) AND mean_logprob IS NOT NULL "
        "ORDER BY mean_logprob DESC, id",
    )


def entropy_collapse(w: Window) -> list[Finding]:
    """Token entropy near zero and still falling: the policy samples (almost) one answer per prompt,
    so groups stop disagreeing and exploration ends. Clip-higher or a higher temperature reopen it."""
    p = w.params
    e = _entropy_thirds(w)
    if e is None or e[1] >= p["min_entropy"] or e[1] >= e[0]:
        return []
    ev = most_confident(w)
    return [
        finding(
            w,
            "entropy_collapse",
            "warning",
            e[1],
            p["min_entropy"],
            ev,
            ("loss.epsilon_high", "sampling.temperature"),
            f"Entropy fell from {e[0]:.4f} to {e[1]:.4f} (first to last third), below {p['min_entropy']:g}.",
        )
    ]


def entropy_explosion(w: Window) -> list[Finding]:
    """Entropy climbing past ~2 nats, or garbled actions (mostly characters outside normal text, or a
    very low mean logprob): the policy drifts into noise and reward follows it down. Climbing: a pretrained
    instruct model sampled at temperature 1 writes prose at about 2 nats a token from its first step, which is
    its nature, not a drift; the last third must also stand `min_rise` above the window's first."""
    p = w.params
    e = _entropy_thirds(w)
    high = e is not None and e[1] > p["max_entropy"] and e[1] > e[0] * (1.0 + p["min_rise"])
    sample = recent_actions(w, int(p["sample_size"]))
    garbled = []
    for r in sample:
        text = "".join(a or "" for a in r["actions"] or [])
        odd = sum(ch not in _NORMAL for ch in text) / len(text) if text else 0.0
        lp = r["mean_logprob"]
        if odd > p["max_odd_chars"] or (lp is not None and math.isfinite(lp) and lp < p["gibberish_logprob"]):
            garbled.append((lp if lp is not None and math.isfinite(lp) else 0.0, -odd, r["id"]))
    share = len(garbled) / len(sample) if sample else 0.0
    if not high and share <= p["max_gibberish"]:
        return []
    garbled.sort()
    ev = [x[2] for x in garbled]
    if not ev:
        ev = ids(
            w,
            "SELECT id FROM rollout_stats WHERE step = (SELECT max(step) FROM rollout_stats) AND mean_logprob "
            "IS NOT NULL ORDER BY mean_logprob, id",
        )
    ent = f"{e[1]:.3f}" if e is not None else "n/a"
    value, threshold = (e[1], p["max_entropy"]) if high else (share, p["max_gibberish"])
    return [
        finding(
            w,
            "entropy_explosion",
            "critical" if high and share > p["max_gibberish"] else "warning",
            value,
            threshold,
            ev,
            ("optimizer.learning_rate", "loss.epsilon_high", "sampling.temperature"),
            f"Entropy over the last third is {ent} (limit {p['max_entropy']:g}) and {_pct(share)} of the latest "
            f"{len(sample)} rollouts look garbled (limit {_pct(p['max_gibberish'])}).",
        )
    ]


# -- optimizer ----------------------------------------------------------------------------------------
def kl_spike(w: Window) -> list[Finding]:
    """A step whose KL, clipped-ratio share or grad norm jumps to many times its window median (and
    past an absolute floor): the update moved the policy too far at once; often the start of a
    collapse or of reward hacking. Grad norms are noisier than KL (an lr = 0 run, whose policy cannot
    move, shows single steps at 6x the median), so they need a larger factor of their own."""
    p = w.params
    limit = [p["grad_spike_factor"], p["spike_factor"], p["kl_floor"], p["clip_floor"], p["grad_norm_floor"]]
    spikes = w.rows(
        "WITH s AS (SELECT step, CASE WHEN name LIKE 'clip_ratio/%' THEN 'clip_ratio' ELSE name END AS sig, "
        "sum(value) AS v "
        "  FROM metrics WHERE name IN ('kl', 'grad_norm', 'clip_ratio/low_mean', 'clip_ratio/high_mean') "
        "AND isfinite(value) "
        "  GROUP BY ALL), "
        "m AS (SELECT sig, median(v) AS med, count(*) AS n FROM s GROUP BY sig) "
        "SELECT s.sig, s.step, s.v, m.med, greatest(CASE s.sig WHEN 'grad_norm' THEN ? ELSE ? END * m.med, "
        "  CASE s.sig WHEN 'kl' THEN ? WHEN 'clip_ratio' THEN ? ELSE ? END) "
        "  AS limit_ FROM s JOIN m USING (sig) WHERE m.n >= ? "
        "  AND s.v > greatest(CASE s.sig WHEN 'grad_norm' THEN ? ELSE ? END * m.med, "
        "  CASE s.sig WHEN 'kl' THEN ? WHEN 'clip_ratio' THEN ? ELSE ? END) "
        "ORDER BY s.v / limit_ DESC, s.step, s.sig",
        [*limit, p["min_steps"], *limit],
    )
    if not spikes:
        return []
    top = spikes[0]
    ev = ids(
        w,
        "SELECT id FROM rollout_stats WHERE step = ? AND mean_logprob IS NOT NULL ORDER BY mean_logprob, id",
        [top["step"]],
    )
    signals = sorted({s["sig"] for s in spikes})
    return [
        finding(
            w,
            "kl_spike",
            "warning",
            top["v"],
            top["limit_"],
            ev,
            ("optimizer.learning_rate", "loss.beta", "loss.epsilon"),
            f"{len(spikes)} spike(s) in {', '.join(signals)}; worst: {top['sig']} = {top['v']:.4g} "
            f"at step {top['step']} vs median {top['med']:.4g} (limit {top['limit_']:.4g}).",
        )
    ]


def nonfinite(w: Window) -> list[Finding]:
    """A skipped non-finite update, or a NaN/inf grad norm, reward or entropy: the arithmetic broke
    (zero std with G=1, a bad batch split, overflow). Any one is critical. `kl` is NaN by design
    when beta = 0, so it is not checked."""
    steps = [
        r[0]
        for r in w.con.execute(
            "SELECT DISTINCT step FROM metrics WHERE (name = 'nonfinite_steps' AND value > 0) OR "
            "(name IN ('grad_norm', 'reward', 'entropy') AND NOT isfinite(value)) "
            "UNION SELECT DISTINCT step FROM rollout_stats WHERE NOT isfinite(reward) ORDER BY step"
        ).fetchall()
    ]
    if not steps:
        return []
    ev = ids(
        w,
        "SELECT id FROM rollout_stats WHERE step IN (SELECT unnest(?::BIGINT[])) ORDER BY isfinite(reward), step, id",
        [steps],
    )
    shown = ", ".join(map(str, steps[:5])) + (" ..." if len(steps) > 5 else "")
    return [
        finding(
            w,
            "nonfinite",
            "critical",
            len(steps),
            0,
            ev,
            ("optimizer.learning_rate", "optimizer.max_grad_norm"),
            f"{len(steps)} step(s) had a non-finite update, grad norm, reward or entropy (steps {shown}).",
        )
    ]


# -- the sampler against the update ---------------------------------------------------------------------------------
def sampling_mismatch(w: Window) -> list[Finding]:
    """The sampler's logprobs of the sampled tokens differ from the update's forward at the same weights by more
    than float noise (TRL's sampling/sampling_logp_difference/mean, averaged over the window): the rollouts come
    from another distribution than the one trained, as with bfloat16 weights or another inference engine, and
    the policy gradient is biased unless importance weights correct it (loss.tis_cap)."""
    p = w.params
    mean, n, worst = w.con.execute(
        "SELECT avg(value), count(*), arg_max(step, value) FROM metrics "
        "WHERE name = 'sampling/sampling_logp_difference/mean' AND isfinite(value)"
    ).fetchone()
    if n < p["min_steps"] or mean is None or mean <= p["max_mean"]:
        return []
    ev = ids(w, "SELECT id FROM rollout_stats WHERE step = ? ORDER BY completion_tokens DESC, id", [worst])
    return [
        finding(
            w,
            "sampling_mismatch",
            "warning",
            mean,
            p["max_mean"],
            ev,
            ("loss.tis_cap",),
            f"The sampler's logprobs differ from the update's by {mean:.3g} nats a token on average over {n} steps "
            f"(above {p['max_mean']:g}; worst at step {worst}): the rollouts were not sampled from the policy "
            "being trained.",
        )
    ]
