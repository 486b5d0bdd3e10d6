"""Detector induction: where reward and audit disagree, find a rule (at most two clauses) that separates
rewarded-but-audit-failed rollouts from rewarded-and-audit-passed ones, and validate it on held-back
rollouts before it may join a suite."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from evotrainer.diagnostics.detector import MAX_EVIDENCE, Window
from evotrainer.diagnostics.rules import (
    CLASSES,
    COLUMNS,
    FIRST_WORD_RE,
    TEXT_SQL,
    Clause,
    Feature,
    Rule,
    feature_values,
    paying_terms,
)
from evotrainer.diagnostics.window import open_window
from evotrainer.store.files import sql_str
from evotrainer.store.rollouts import RolloutStore
from evotrainer.types import TERMINATIONS

# Literal patterns mined from the text: tags, words, single symbols (the tokens a reader would name)
# and short character n-grams (what tokens miss: "><", "r><"). Digit strings are left to the
# digit-class features, which generalize across answers where a literal "94" would not.
_TOKEN = re.compile(r"</?[A-Za-z_][\w-]*>|[A-Za-z_]+|[^\sA-Za-z0-9]")
_NGRAMS = (2, 3, 4)
_MINE_PER_CLASS, _MINE_CHARS, _MINE_SHORTLIST = 400, 4000, 200
_PAIR_MARGIN = 0.02  # a second clause must buy this much fit F1, or the simpler rule wins


@dataclass(frozen=True)
class Score:
    """How a rule's flags match the audit on a set of rewarded rollouts: positives are audit failures."""

    precision: float
    recall: float
    specificity: float
    support: int
    """Positives (rewarded-but-audit-failed rollouts) in the set."""
    negatives: int
    flagged: int

    @property
    def f1(self) -> float:
        return (
            2 * self.precision * self.recall / (self.precision + self.recall) if self.precision + self.recall else 0.0
        )


def score(flag: np.ndarray, y: np.ndarray) -> Score:
    tp, fp = int((flag & y).sum()), int((flag & ~y).sum())
    pos, neg = int(y.sum()), int((~y).sum())
    return Score(
        precision=tp / (tp + fp) if tp + fp else 0.0,
        recall=tp / pos if pos else 0.0,
        specificity=1 - fp / neg if neg else 0.0,
        support=pos,
        negatives=neg,
        flagged=tp + fp,
    )


@dataclass
class Induction:
    """The outcome of one induction: the best rule found on the fit part, its scores on fit and
    held-back rollouts, whether it was accepted (and if not, why), and held-back rollout ids by
    outcome (caught, false_alarm, missed; a few each) so a reader can open the trajectories."""

    accepted: bool
    reason: str
    rule: Rule | None
    fit: Score | None
    held_back: Score | None
    counts: dict[str, int]
    settings: dict[str, Any] = field(default_factory=dict)
    candidates: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "reason": self.reason,
            "rule": self.rule.model_dump(mode="json") if self.rule else None,
            "rule_text": self.rule.describe() if self.rule else None,
            "fit": asdict(self.fit) if self.fit else None,
            "held_back": asdict(self.held_back) if self.held_back else None,
            "counts": dict(self.counts),
            "settings": dict(self.settings),
            "candidates": self.candidates,
            "examples": {k: list(v) for k, v in self.examples.items()},
        }


def split_held_back(keys: list[str], y: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """True for the held-back rollouts. Whole keys (task, group or step) go to one side, so
    near-duplicates (one prompt's samples) never straddle the split. Keys are visited in a seeded
    hash order and each goes to the side that keeps the held-back share of positives and of
    negatives nearer `fraction`: a plain hash split of a few dozen keys often leaves one class thin
    on one side (a stratified group split)."""

    def h(k: str) -> bytes:
        return hashlib.sha256(f"{seed}:{k}".encode()).digest()

    per_key: dict[str, np.ndarray] = {}
    for k, label in zip(keys, y):
        per_key.setdefault(k, np.zeros(2))[int(label)] += 1
    total = np.maximum(np.array([(~y).sum(), y.sum()], dtype=float), 1)
    seen, hb, held = np.zeros(2), np.zeros(2), set()
    for k in sorted(per_key, key=h):
        seen += per_key[k]
        miss_out = float((((hb - fraction * seen) / total) ** 2).sum())
        miss_in = float((((hb + per_key[k] - fraction * seen) / total) ** 2).sum())
        if miss_in < miss_out or (miss_in == miss_out and h(k)[0] < 256 * fraction):
            hb += per_key[k]
            held.add(k)
    return np.array([k in held for k in keys], dtype=bool)


def mine_literals(texts: list[str], y: np.ndarray, max_literals: int, seed: int) -> list[str]:
    """The literal substrings whose count best separates positives from negatives. Candidates are
    tokens and character n-grams of a sample of the texts (at most _MINE_PER_CLASS per class, first
    _MINE_CHARS characters each: mining only proposes, the SQL feature later counts the whole text),
    pre-ranked by how much their mean count differs between the classes, weighted by how many rollouts
    hold them, then scored exactly by the best count threshold."""
    rng = np.random.default_rng(seed)
    pick = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:_MINE_PER_CLASS] for c in (True, False)])
    texts, y = [texts[i][:_MINE_CHARS] for i in sorted(pick)], y[np.sort(pick)]
    grams = [
        Counter(_TOKEN.findall(t)) + Counter(t[i : i + n] for n in _NGRAMS for i in range(len(t) - n + 1))
        for t in texts
    ]
    stats: dict[str, np.ndarray] = {}  # literal -> [count in positives, count in negatives, df pos, df neg]
    for g, label in zip(grams, y):
        for lit, c in g.items():
            st = stats.setdefault(lit, np.zeros(4))
            st[0 if label else 1] += c
            st[2 if label else 3] += 1
    n_pos, n_neg = max(int(y.sum()), 1), max(int((~y).sum()), 1)

    def prerank(st: np.ndarray) -> float:
        mp, mn = st[0] / n_pos, st[1] / n_neg
        return abs(mp - mn) / max(mp, mn) * max(st[2] / n_pos, st[3] / n_neg)

    # Seen in 2+ rollouts (one rollout's quirk is no pattern); no digits: ">10<" is one answer, not
    # a pattern, and digits are the digit-class features' job.
    lits = [
        lit for lit, st in stats.items() if st[2] + st[3] >= 2 and lit.strip() and not any(ch.isdigit() for ch in lit)
    ]
    lits = sorted(lits, key=lambda lit: (-prerank(stats[lit]), lit))[:_MINE_SHORTLIST]
    # Literals that count the same in every text say the same thing ("<a", "<ans", "<answer>"): keep
    # the longest, the one a reader recognizes, so the shortlist is not one pattern twelve times.
    by_counts: dict[bytes, str] = {}
    for lit in lits:
        key = np.array([t.count(lit) for t in texts], dtype=np.int32).tobytes()
        if key not in by_counts or (len(lit), lit) > (len(by_counts[key]), by_counts[key]):
            by_counts[key] = lit
    ranked = sorted(
        (-_best_threshold(np.frombuffer(k, dtype=np.int32).astype(float), y, int(y.sum()), True)[0], lit)
        for k, lit in by_counts.items()
    )
    return [lit for _, lit in ranked[:max_literals]]


def candidate_features(
    texts: list[str], y: np.ndarray, terminations: set[str], first_words: Counter, max_literals: int, seed: int
) -> list[Feature]:
    """The fixed families (columns, character classes, terminations and first words of turns seen in
    the evidence) plus the mined literals."""
    feats = [Feature(kind="column", arg=c) for c in COLUMNS]
    feats += [Feature(kind=k, arg=c) for k in ("count_class", "run_class") for c in CLASSES]
    feats += [Feature(kind="termination", arg=t) for t in TERMINATIONS if t in terminations]
    feats += [Feature(kind="first_word", arg=w) for w, c in first_words.most_common(10) if c >= 2]
    return feats + [Feature(kind="count", arg=lit) for lit in mine_literals(texts, y, max_literals, seed)]


def _best_threshold(x: np.ndarray, y: np.ndarray, total_pos: int, integer: bool) -> tuple[float, str, float]:
    """(F1, op, threshold) of the best clause `x op threshold` on these rollouts; recall counts
    against total_pos (positives outside this subset are missed). NaN never matches, as NULL in SQL."""
    ok = ~np.isnan(x)
    vals = np.unique(x[ok])
    if len(vals) == 0 or total_pos == 0:
        return 0.0, ">=", 0.0
    pos, neg = np.sort(x[ok & y]), np.sort(x[ok & ~y])
    best = (0.0, ">=", float(vals[0]))
    for op in (">=", "<="):
        if op == ">=":
            tp = len(pos) - np.searchsorted(pos, vals, "left")
            fp = len(neg) - np.searchsorted(neg, vals, "left")
        else:
            tp = np.searchsorted(pos, vals, "right")
            fp = np.searchsorted(neg, vals, "right")
        f1 = 2 * tp / np.maximum(2 * tp + fp + (total_pos - tp), 1)
        k = int(np.argmax(f1))
        if f1[k] > best[0] + 1e-12:
            # Between the last value kept and the next one out: the clause flags the same fit rollouts
            # and sits halfway to the other side (an integer feature keeps an integer threshold).
            if op == ">=":
                t = vals[k] if integer or k == 0 else (vals[k - 1] + vals[k]) / 2
            else:
                t = vals[k] if integer or k == len(vals) - 1 else (vals[k] + vals[k + 1]) / 2
            best = (float(f1[k]), op, float(t))
    return best


def _flags(X: np.ndarray, clauses: list[tuple[int, str, float]]) -> np.ndarray:
    m = np.ones(len(X), dtype=bool)
    for j, op, t in clauses:
        with np.errstate(invalid="ignore"):
            m &= (X[:, j] >= t) if op == ">=" else (X[:, j] <= t)
    return m


def search(X: np.ndarray, y: np.ndarray, integer: list[bool], top: int = 8) -> list[tuple[int, str, float]]:
    """The best rule on (X, y) by F1: the best single clause, or the best pair built on one of the
    `top` single clauses when the pair beats it by _PAIR_MARGIN (prefer the simpler explanation)."""
    P = int(y.sum())
    singles = sorted(
        ((*_best_threshold(X[:, j], y, P, integer[j]), j) for j in range(X.shape[1])), key=lambda s: (-s[0], s[3])
    )
    f1, op, t, j = singles[0]
    best, best_f1 = [(j, op, t)], f1
    for f1_1, op1, t1, j1 in singles[:top]:
        m = _flags(X, [(j1, op1, t1)])
        for j2 in range(X.shape[1]):
            if j2 == j1:
                continue
            f1_2, op2, t2 = _best_threshold(X[m, j2], y[m], P, integer[j2])
            if f1_2 > best_f1 + _PAIR_MARGIN and f1_2 > f1_1 + _PAIR_MARGIN:
                best, best_f1 = [(j1, op1, t1), (j2, op2, t2)], f1_2
    return best


# Features that measure how much was written rather than what: a rule on them alone is a proxy (long
# answers fail more often) that also fires on long honest answers, and on an arm that pays for them no more.
_PROXIES = frozenset(
    {
        ("column", "completion_tokens"),
        ("column", "max_action_tokens"),
        ("column", "chars"),
        ("column", "num_turns"),
        ("count_class", "letters"),
        ("count_class", "spaces"),
        ("run_class", "letters"),
        ("run_class", "spaces"),
    }
)
_PROXY_MARGIN = 0.1  # a rule on the behaviour's own features wins unless a proxy rule fits this much better


def is_proxy(f: Feature) -> bool:
    return (f.kind, f.arg) in _PROXIES


def _minima(s: Score, min_precision: float, min_recall: float) -> list[tuple[str, float, float, int]]:
    """(name, value, minimum, count it is a proportion of) for each acceptance minimum: the one list _verdict and
    _clears hold a rule to, so that a swap never takes a rule the verdict must reject."""
    return [
        ("precision", s.precision, min_precision, s.flagged),
        ("recall", s.recall, min_recall, s.support),
        ("specificity", s.specificity, min_precision, s.negatives),
    ]


def _clears(s: Score, min_precision: float, min_recall: float) -> bool:
    """Whether a fit-part score clears the acceptance minima by one standard error of each proportion:
    a rule that only just clears them on the fit part fails them on the held-back part about half the time
    (on 80 positives a recall of 0.915 has a standard error of 0.03), so it is no safe swap for one that fits well."""
    se = lambda p, n: (p * (1 - p) / max(n, 1)) ** 0.5  # noqa: E731 -- binomial standard error
    return all(v - se(v, n) >= need for _, v, need, n in _minima(s, min_precision, min_recall))


def prefer_behaviour(
    X: np.ndarray, y: np.ndarray, feats: list[Feature], min_precision: float = 0.9, min_recall: float = 0.9
) -> list[tuple[int, str, float]]:
    """The best rule, unless it rests on proxies only (length, letter counts) and a rule on the behaviour's
    own features (literals, first words, terminations, character classes of content) fits nearly as well
    (within _PROXY_MARGIN of F1) and clears the acceptance minima with room to spare: then that one, which
    names the exploit and not its side effect. Where honest answers have one fixed length (a one-digit
    answer in its tag), length is no proxy but the exploit's exact signature, and the better fit keeps it."""
    integer = [f.integer for f in feats]
    best = search(X, y, integer)
    if not all(is_proxy(feats[j]) for j, _, _ in best):
        return best
    own = [j for j, f in enumerate(feats) if not is_proxy(f)]
    if not own:
        return best
    alt = [(own[j], op, t) for j, op, t in search(X[:, own], y, [integer[j] for j in own])]
    alt_s = score(_flags(X, alt), y)
    near = alt_s.f1 >= score(_flags(X, best), y).f1 - _PROXY_MARGIN
    return alt if near and _clears(alt_s, min_precision, min_recall) else best


def induce(
    store: RolloutStore,
    branch: str,
    first_step: int,
    last_step: int,
    *,
    rewarded_threshold: float = 0.5,
    min_precision: float = 0.9,
    min_recall: float = 0.9,
    min_support: int = 10,
    held_back: float = 0.5,
    split_by: Literal["task", "group", "step"] = "task",
    seed: int = 0,
    max_literals: int = 12,
) -> Induction:
    """Induce a detector from the window's audited, rewarded (reward >= rewarded_threshold) train
    rollouts. Positives fail the audit, negatives pass it. The rollouts are split by `split_by` into
    a fit part (mining and threshold search) and a held-back part (validation only). Accepted only if
    on the held-back part precision >= min_precision, recall >= min_recall and the rule spares at
    least min_precision of the audit-passing rollouts (where nearly every rewarded rollout fails,
    "flag everything" would look precise), with at least min_support positives and negatives there.
    By default the split is by task: one prompt's samples at different steps are near-duplicates too."""
    settings = {
        "branch": branch,
        "first_step": first_step,
        "last_step": last_step,
        "rewarded_threshold": rewarded_threshold,
        "min_precision": min_precision,
        "min_recall": min_recall,
        "min_support": min_support,
        "held_back": held_back,
        "split_by": split_by,
        "seed": seed,
    }
    w = open_window(store, branch, first_step, last_step)
    try:
        where, args = "WHERE audit IS NOT NULL AND isfinite(reward) AND reward >= ?", [rewarded_threshold]
        meta = _rewarded_audited(w, where, args)
        y = np.array([not r["audit"] for r in meta], dtype=bool)
        hb = split_held_back(_split_keys(meta, split_by), y, held_back, seed)
        counts = _split_counts(y, hb)
        if (short := _shortfall(counts, min_support)) is not None:
            return Induction(False, short, None, None, None, counts, settings)
        feats, X = _fit_features(w, meta, y, hb, where, args, max_literals, seed)
        best = prefer_behaviour(X[~hb], y[~hb], feats, min_precision, min_recall)
        clauses = tuple(Clause(feature=feats[j], op=op, threshold=t) for j, op, t in best)
        flag = _flags(X, best)
        fit_s, hb_s = score(flag[~hb], y[~hb]), score(flag[hb], y[hb])
        examples = _held_back_examples(meta, hb, flag, y)
        rule = _recorded_rule(w, clauses, fit_s, hb_s, settings)
    finally:
        w.con.close()
    accepted, reason = _verdict(hb_s, min_precision, min_recall)
    return Induction(accepted, reason, rule, fit_s, hb_s, counts, settings, candidates=len(feats), examples=examples)


def _rewarded_audited(w: Window, where: str, args: list[Any]) -> list[dict[str, Any]]:
    """The window's rollouts matching `where`, by id: audit, split keys, termination, text and first words of turns."""
    first_word = f"regexp_extract(coalesce(t.action, ''), {sql_str(FIRST_WORD_RE)}, 1)"
    return w.rows(
        f"SELECT id, audit, task_id, group_id, step, termination, {TEXT_SQL} AS text, "
        f"list_transform(turns, lambda t: {first_word}) AS words FROM rollouts {where} ORDER BY id",
        args,
    )


def _split_keys(meta: list[dict[str, Any]], split_by: str) -> list[str]:
    """Each rollout's split key: its task, group or step."""
    return [
        str(r["task_id"] if split_by == "task" else r["group_id"] if split_by == "group" else r["step"]) for r in meta
    ]


def _split_counts(y: np.ndarray, hb: np.ndarray) -> dict[str, int]:
    """Positives and negatives in all, in the fit part and in the held-back part."""
    return {
        "rewarded_audited": len(y),
        "positives": int(y.sum()),
        "negatives": int((~y).sum()),
        "fit_positives": int((y & ~hb).sum()),
        "fit_negatives": int((~y & ~hb).sum()),
        "held_back_positives": int((y & hb).sum()),
        "held_back_negatives": int((~y & hb).sum()),
    }


def _shortfall(counts: dict[str, int], min_support: int) -> str | None:
    """Why there is too little evidence to induce from (a side with fewer than min_support of a class), or None."""
    short = [
        f"{k.replace('_', ' ')} {counts[k]}"
        for k in ("fit_positives", "fit_negatives", "held_back_positives", "held_back_negatives")
        if counts[k] < min_support
    ]
    if not short:
        return None
    what = "reward and audit agree" if counts["positives"] < 2 * min_support else "too little evidence"
    return f"{what}: {', '.join(short)} (need {min_support} each)"


def _fit_features(
    w: Window,
    meta: list[dict[str, Any]],
    y: np.ndarray,
    hb: np.ndarray,
    where: str,
    args: list[Any],
    max_literals: int,
    seed: int,
) -> tuple[list[Feature], np.ndarray]:
    """The candidate features, mined on the fit part, and their values on every rollout (NaN for NULL)."""
    # Mine on the fit part only: the held-back rollouts must not shape the candidates they judge.
    texts = [r["text"] for r in meta]
    fit_idx = np.flatnonzero(~hb)
    words = Counter(wd for i in fit_idx for wd in set(meta[i]["words"] or []) if wd)
    feats = candidate_features(
        [texts[i] for i in fit_idx],
        y[fit_idx],
        {meta[i]["termination"] for i in fit_idx},
        words,
        max_literals,
        seed,
    )
    rows = feature_values(w, feats, where, args)
    assert [r["id"] for r in rows] == [r["id"] for r in meta]
    X = np.array(
        [[np.nan if r[f"f{j}"] is None else r[f"f{j}"] for j in range(len(feats))] for r in rows], dtype=float
    )
    return feats, X


def _held_back_examples(
    meta: list[dict[str, Any]], hb: np.ndarray, flag: np.ndarray, y: np.ndarray
) -> dict[str, list[str]]:
    """A few held-back rollout ids per outcome: caught, false alarm, missed."""
    return {
        name: [meta[i]["id"] for i in np.flatnonzero(hb & sel)[:MAX_EVIDENCE]]
        for name, sel in (("caught", flag & y), ("false_alarm", flag & ~y), ("missed", ~flag & y))
    }


def _recorded_rule(
    w: Window, clauses: tuple[Clause, ...], fit_s: Score, hb_s: Score, settings: dict[str, Any]
) -> Rule:
    """The rule with its evidence (held-back scores, fit F1, window, split) and the terms that paid its matches."""
    evidence = {
        "precision": round(hb_s.precision, 4),
        "recall": round(hb_s.recall, 4),
        "support": hb_s.support,
        "negatives": hb_s.negatives,
        "specificity": round(hb_s.specificity, 4),
        "fit_f1": round(fit_s.f1, 4),
        "window": f"{settings['branch']}:{settings['first_step']}-{settings['last_step']}",
        "split_by": settings["split_by"],
        "seed": settings["seed"],
    }
    rule = Rule(clauses=clauses, min_reward=settings["rewarded_threshold"], evidence=evidence)
    # The terms that paid the matches, by the same query the detector runs, kept as the rule's record.
    return rule.model_copy(update={"knobs": paying_terms(w, rule)})


def _verdict(hb_s: Score, min_precision: float, min_recall: float) -> tuple[bool, str]:
    """Whether the held-back scores pass (precision, recall, specificity) and the reason, either way."""
    fails = [f"{name} {v:.3f} < {need}" for name, v, need, _ in _minima(hb_s, min_precision, min_recall) if v < need]
    reason = (
        f"held-back {', '.join(fails)}"
        if fails
        else f"held-back precision {hb_s.precision:.3f}, recall {hb_s.recall:.3f} on {hb_s.support} positives / "
        f"{hb_s.negatives} negatives"
    )
    return not fails, reason
