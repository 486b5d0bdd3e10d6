"""The default proposer (no network): findings -> candidate interventions from a catalog of known
remedies (docs/design.md, failure modes and their remedies), ranked by the skill library's
evidence for the same signature and domain, with a share of candidates kept for knobs this run has
not tried (exploration). `screen` (proposer.py) then drops duplicates and anything already rejected
under the same signature."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from evotrainer.diagnostics.detector import Finding
from evotrainer.envs import domains
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Hypothesis, Intervention, knob_value
from evotrainer.harness.remedies import ACC, DROP_TERM, REWEIGHT_TERM, Remedy, const, scale
from evotrainer.proposers.moves import explore, moves
from evotrainer.proposers.pairs import pairs
from evotrainer.proposers.proposer import Brief, Proposal, ProposerOutput, change_key, intervention_key, screen


def _restore_spread(h: Harness, f: Finding) -> Any:
    """A temperature well below 1 (an evaluation setting copied into training) goes back to 1, the
    usual training default; one already near it goes up by 30% (capped at 1.5)."""
    t = h.sampling.temperature
    return 1.0 if t < 0.77 else float(f"{min(t * 1.3, 1.5):.3g}")


def _mask_errors(h: Harness, f: Finding) -> Any:
    current = list(h.filters.mask_terminations)
    return None if {"error", "timeout"} <= set(current) else sorted(set(current) | {"error", "timeout"})


def _shorter_observations(h: Harness, f: Finding) -> Any:
    """Multi-turn only: cut observations to 64 tokens, or halve a cut already set (not below 16)."""
    cap = h.multi_turn.max_observation_tokens
    if h.multi_turn.max_turns == 1 or cap == 16:
        return None
    return 64 if not cap else max(16, cap // 2)


def _other_tool_policy(h: Harness, f: Finding) -> Any:
    return {"feedback": "end", "end": "mask", "mask": "feedback"}[h.multi_turn.tool_error]


# The core catalog: finding name -> remedies, most recommended first (docs/design.md, failure modes); each
# domain brings remedies for its own findings (remedies_for). Reward-term remedies target the term the finding
# implicates; see _targets.
CATALOG: dict[str, list[Remedy]] = {
    "zero_variance_groups": [
        Remedy(
            "set_knob",
            "filters.dynamic_sampling",
            lambda h, f: None if h.filters.dynamic_sampling else True,
            "frac_reward_zero_std",
            "down",
            "DAPO dynamic sampling: groups with no spread are replaced by other prompts, so every group trained "
            "carries an advantage",
        ),
        Remedy(
            "set_knob",
            "curriculum.easy_threshold",
            lambda h, f: (
                None if h.curriculum.easy_threshold is not None or "curriculum.easy_threshold" not in f.knobs else 1.0
            ),
            "frac_reward_zero_std",
            "down",
            "the dead groups are solved prompts: stop drawing a prompt once its group was all correct",
        ),
        Remedy(
            "set_knob",
            "sampling.temperature",
            _restore_spread,
            "frac_reward_zero_std",
            "down",
            "more sampling spread makes more groups mixed, so more prompts carry an advantage",
        ),
        Remedy(
            "set_knob",
            "sampling.num_generations",
            scale("sampling.num_generations", 2, 2, 32, True),
            "frac_reward_zero_std",
            "down",
            "larger groups are less often all-correct or all-wrong",
        ),
    ],
    "dead_outcome_groups": [
        Remedy(
            "add_filter",
            "filters.std_keep_ratio",
            lambda h, f: None if h.filters.std_keep_ratio is not None else 0.9,
            "frac_trainable",
            "down",
            "the paper's group filter (keep ratio 0.9, EMA decay 0.95): groups whose only spread is the shaping's "
            "have the lowest std, and leave the loss",
        ),
        Remedy(
            "set_knob",
            "sampling.temperature",
            _restore_spread,
            "frac_reward_zero_std",
            "down",
            "more sampling spread makes more groups mixed on the outcome",
        ),
    ],
    "plateau": [
        Remedy(
            "set_knob",
            "optimizer.learning_rate",
            scale("optimizer.learning_rate", 3.0, 1e-6, 1e-2),
            ACC,
            "up",
            "reward is flat below its ceiling: the step size may be too small to move the policy",
        ),
        Remedy(
            "set_knob",
            "sampling.temperature",
            scale("sampling.temperature", 1.3, 0.1, 1.5),
            ACC,
            "up",
            "more exploration can find rewarded behaviour the policy does not sample yet",
        ),
    ],
    "truncation": [
        Remedy(
            "set_knob",
            "sampling.max_completion_length",
            scale("sampling.max_completion_length", 1.5, 4, 4096, True),
            "completions/clipped_ratio",
            "down",
            "the cap cuts answers before they finish",
        ),
        Remedy(
            "set_knob",
            "multi_turn.max_observation_tokens",
            _shorter_observations,
            "completions/clipped_ratio",
            "down",
            "long tool observations fill the context before a multi-turn episode can finish",
        ),
        Remedy(
            "add_filter",
            "loss.mask_truncated_completions",
            const(True),
            "completions/clipped_ratio",
            "down",
            "truncated rollouts get a reward that is not about the task; mask them out of the loss",
        ),
    ],
    "length_blowup": [
        Remedy(
            "set_knob",
            "shaping.overlong_buffer_len",
            lambda h, f: max(1, h.sampling.max_completion_length // 4),
            "completions/mean_length",
            "down",
            "a soft overlong penalty pushes back on length growth (DAPO)",
        ),
        Remedy(
            "swap_loss_type",
            "loss.loss_type",
            lambda h, f: None if h.loss.loss_type == "dr_grpo" else "dr_grpo",
            "completions/mean_length",
            "down",
            "length-unbiased aggregation removes the per-sequence length bias",
        ),
    ],
    "entropy_collapse": [
        Remedy(
            "set_knob",
            "loss.entropy_coef",
            lambda h, f: None if h.loss.entropy_coef else 0.001,
            "entropy",
            "up",
            "an entropy bonus in the loss keeps the policy from collapsing to near-deterministic outputs",
        ),
        Remedy(
            "set_knob",
            "loss.epsilon_high",
            lambda h, f: None if (h.loss.epsilon_high or 0) >= 0.28 else 0.28,
            "entropy",
            "up",
            "clip-higher lets low-probability tokens grow (DAPO), slowing entropy collapse",
        ),
        Remedy(
            "set_knob",
            "sampling.temperature",
            scale("sampling.temperature", 1.2, 0.1, 1.5),
            "entropy",
            "up",
            "a higher sampling temperature keeps exploration alive",
        ),
    ],
    "entropy_explosion": [
        Remedy(
            "set_knob",
            "optimizer.learning_rate",
            scale("optimizer.learning_rate", 0.5, 1e-7, 1e-2),
            "entropy",
            "down",
            "smaller steps keep the policy from drifting into garbled text",
        ),
        Remedy(
            "set_knob",
            "sampling.temperature",
            scale("sampling.temperature", 0.8, 0.1, 1.5),
            "entropy",
            "down",
            "a lower temperature samples fewer garbled tokens",
        ),
    ],
    "reward_hacking": [DROP_TERM, REWEIGHT_TERM],
    "reward_audit_gap": [
        Remedy(
            "remove_reward_term",
            "reward_weights.{term}",
            const(None),
            ACC,
            "up",
            "rollouts the reward pays fail the audit; the term paying most on them is suspect",
        ),
    ],
    "repetition": [
        Remedy(
            "set_knob",
            "shaping.overlong_buffer_len",
            lambda h, f: max(1, h.sampling.max_completion_length // 4),
            "completions/mean_length",
            "down",
            "penalising the long tail discourages loops",
        ),
    ],
    "sampling_mismatch": [
        Remedy(
            "set_knob",
            "loss.tis_cap",
            lambda h, f: None if h.loss.tis_cap is not None else 2.0,
            "sampling/importance_sampling_ratio/max",
            "down",
            "truncated importance sampling weights each token by p_train / p_sample (capped at 2, verl's default), "
            "so rollouts the sampler drew from a slightly other distribution train the policy without bias",
        ),
    ],
    "kl_spike": [
        Remedy(
            "set_knob",
            "optimizer.learning_rate",
            scale("optimizer.learning_rate", 0.5, 1e-7, 1e-2),
            "kl",
            "down",
            "ratio and KL spikes follow steps that are too large",
        ),
        Remedy(
            "set_knob",
            "optimizer.max_grad_norm",
            scale("optimizer.max_grad_norm", 0.5, 0.01, 100.0),
            "grad_norm",
            "down",
            "tighter gradient clipping bounds each update",
        ),
    ],
    # The gate's finding on a candidate run that fell significantly below the start (stages/decide.py _fell).
    "heldout_regression": [
        Remedy(
            "set_knob",
            "optimizer.learning_rate",
            scale("optimizer.learning_rate", 0.5, 1e-7, 1e-2),
            ACC,
            "up",
            "a change whose runs fell below the start within a trial took steps too large for it: halve the step",
        ),
    ],
    "nonfinite": [
        Remedy(
            "set_knob",
            "optimizer.max_grad_norm",
            scale("optimizer.max_grad_norm", 0.5, 0.01, 100.0),
            "grad_norm",
            "down",
            "non-finite gradients come from exploding updates",
        ),
    ],
    "tool_errors": [
        Remedy(
            "set_knob",
            "multi_turn.tool_error",
            _other_tool_policy,
            ACC,
            "up",
            "how malformed tool calls are treated changes what the policy learns from them",
        ),
        Remedy(
            "set_knob",
            "multi_turn.max_turns",
            scale("multi_turn.max_turns", 1.5, 1, 64, True),
            "turn_cap_ratio",
            "down",
            "episodes hit the turn cap before they can answer",
        ),
    ],
    "infra_errors": [
        Remedy(
            "add_filter",
            "filters.mask_terminations",
            _mask_errors,
            ACC,
            "up",
            "infrastructure failures are not the policy's fault; mask them out of the advantages",
        ),
    ],
}

# Collapse read from the sampled solutions and tokens: the entropy-collapse remedies, aimed at those signals. Fewer
# distinct solutions want more sampling spread first; a near-0 log-probability, the entropy bonus first.
_SPREAD = CATALOG["entropy_collapse"]
CATALOG["solution_collapse"] = [
    replace(r, signal="completions/distinct_per_group", direction="up") for r in (_SPREAD[2], _SPREAD[0], _SPREAD[1])
]
CATALOG["logprob_collapse"] = [replace(r, signal="completions/mean_logprob", direction="down") for r in _SPREAD]


def remedies_for(name: str) -> list[Remedy]:
    """The catalog's remedies for a finding, then those the registered domains bring for it (envs/domains.py:
    a domain's exploit findings regrade first, then drop or reweight the term)."""
    return [*CATALOG.get(name, ()), *domains.remedies().get(name, ())]


def _targets(remedy: Remedy, f: Finding) -> list[str]:
    if "{term}" not in remedy.target:
        return [remedy.target]
    return [k for k in f.knobs if k.startswith("reward_weights.") and k != "reward_weights"]


def candidates_for(f: Finding, h: Harness) -> list[Intervention]:
    """The catalog's remedies for a finding, then graded moves of every knob it names (tried after the
    catalog's value, or when the catalog has none for that knob): the search never runs out of moves
    while a finding stands."""
    out = [iv for r in remedies_for(f.name) for iv in _remedy(r, f, h)]
    # A graded move that sets what a catalog remedy sets under another kind (set_knob, not add_filter) is the same
    # change, and would take a slot only to be replayed to the same result.
    remedied = {change_key(iv) for iv in out}
    for path in f.knobs:
        if path.startswith("reward_weights."):
            continue  # a term moves by its remedies, not by graded moves (moves.py); it may not be paid yet
        up = next(
            (
                iv.value > knob_value(h, path)
                for iv in out
                if iv.target == path and isinstance(iv.value, float) and isinstance(knob_value(h, path), float)
            ),
            None,
        )
        for v in moves(h, path, up):
            move = Intervention(
                kind="set_knob",
                target=path,
                value=v,
                hypothesis=Hypothesis(
                    finding=f.name, signal=ACC, direction="up", rationale=f"{f.name} names {path}: a graded move"
                ),
            )
            if change_key(move) not in remedied:
                out.append(move)
    return out


def _remedy(r: Remedy, f: Finding, h: Harness) -> list[Intervention]:
    out = []
    for target in _targets(r, f):
        term = target.split(".", 1)[1]
        value = r.value(h, f)
        if r.kind == "replace_reward_term":
            # Only to a grader the finding names (so the domain has it) that the harness does not pay yet.
            value = next(
                (
                    v
                    for v in domains.audited_variants().get(term, ())
                    if f"reward_weights.{v}" in f.knobs and v not in h.reward_weights
                ),
                None,
            )
        if value is None and r.kind != "remove_reward_term":
            continue
        if (
            r.kind in ("remove_reward_term", "set_reward_weight", "replace_reward_term")
            and term not in h.reward_weights
        ):
            continue
        if r.kind == "add_reward_term" and term in h.reward_weights:
            continue
        hyp = Hypothesis(finding=f.name, signal=r.signal, direction=r.direction, rationale=r.rationale)
        out.append(Intervention(kind=r.kind, target=target, value=value, hypothesis=hyp))
    return out


class HeuristicProposer:
    name = "heuristic"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def propose(self, brief: Brief) -> ProposerOutput:
        """Skills for this signature first (by evidence), then catalog remedies for the findings
        (most severe first), with `explore` of the slots reserved for untried knobs."""
        h = brief.harness
        ranked: list[Proposal] = []
        for s in sorted(
            brief.skills, key=lambda s: (-s.similarity, s.quarantined, -(s.wins - s.losses), -s.mean_effect)
        ):
            if s.similarity > 0 and s.wins > s.losses:
                ranked.append(
                    Proposal(
                        s.intervention,
                        "skill",
                        s.skill_id,
                        f"skill {s.skill_id}: {s.wins} won, {s.losses} lost, similarity {s.similarity:.2f}",
                    )
                )
        # A change rejected alone while its window newly carried a finding that names another knob, tried with that
        # knob moved (pairs.py): the most specific evidence a round has, so the latest goes before the catalog.
        two_factor = [Proposal(iv, "pair", note=iv.hypothesis.rationale) for iv in pairs(brief, candidates_for)]
        ranked += two_factor[:1]
        order = {"critical": 0, "warning": 1, "info": 2}
        # Among equally severe findings, one whose first remedy regrades a reward term names the exploit's
        # channel (tests edited, examples hard-coded) and closes it; the generic validity findings that fire
        # beside it (reward_audit_gap, reward_hacking) can only drop or reweight terms. Then by name.
        per = [(f, candidates_for(f, h)) for f in brief.findings]
        per.sort(
            key=lambda fc: (
                order[fc[0].severity],
                not fc[0].validity,
                not (fc[1] and fc[1][0].kind == "replace_reward_term"),
                fc[0].name,
            )
        )
        # Interleave remedies across findings so one noisy finding cannot take every slot.
        per_finding = [c for _, c in per]
        for i in range(max((len(c) for c in per_finding), default=0)):
            ranked += [Proposal(c[i], "catalog") for c in per_finding if i < len(c)]
        ranked += two_factor[1:]
        # A move rejected under this signature since the mainline last moved is screened out (proposer.py:
        # standing), so the next rung of the same knob comes up in its place.
        exploratory = [Proposal(iv, "explore") for iv in explore(h, brief.findings, [*brief.history, *brief.losses])]
        kept, _ = screen(ranked + exploratory, brief)
        n_explore = round(brief.limit * brief.explore) if exploratory else 0
        main = [p for p in kept if p.source != "explore"][: brief.limit - n_explore]
        extra = [
            p
            for p in kept
            if p.source == "explore"
            and intervention_key(p.intervention) not in {intervention_key(m.intervention) for m in main}
        ]
        out = (main + extra[: brief.limit - len(main)])[: brief.limit]
        taken = {intervention_key(p.intervention) for p in out}
        spares = [p for p in kept if intervention_key(p.intervention) not in taken][: brief.limit]
        return ProposerOutput(out, spares=spares)
