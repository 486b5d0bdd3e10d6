"""The update's packing: a group's shared prompt run once gives the same logprobs, entropies and gradients as
every row run whole, on single-turn (math) and multi-turn (digits, observations between actions) rollouts."""

from __future__ import annotations

import pytest
import torch

from evotrainer.training.packing import FullPack, PromptPack, pack_logprobs
from evotrainer.training.rollout import run_episodes


def _episodes(setup, n_tasks: int, g: int, turns: int):
    cfg, domain, policy = setup
    tasks = [t for t in domain.tasks("train")[:n_tasks] for _ in range(g)]
    return run_episodes(
        policy, domain, tasks, max_new_tokens=6, max_turns=turns, generator=torch.Generator().manual_seed(0)
    )


@pytest.mark.parametrize("setup_name, turns", [("math_setup", 1), ("digits_setup", 4)])
def test_shared_prompts_score_what_whole_rows_score(setup_name, turns, request):
    setup = request.getfixturevalue(setup_name)
    policy = setup[2]
    eps = _episodes(setup, n_tasks=5, g=4, turns=turns)
    if turns > 1:
        assert any(not all(e.is_action[e.is_action.index(True) :]) for e in eps), "no observation between actions"
    idx = list(range(len(eps)))
    weights = torch.randn(len(eps), generator=torch.Generator().manual_seed(1))
    results = {}
    for kind in (FullPack, PromptPack):
        packed = kind.of(eps, idx, policy.pad_id)
        policy.model.zero_grad(set_to_none=True)
        logp, ent = pack_logprobs(policy.model, packed, 0.9, entropy=True)
        per_row = [lp[m] for lp, m in zip(logp, packed.amask)]
        ents = [e[m] for e, m in zip(ent, packed.amask)]
        sum(w * (lp.sum() + 0.1 * e.sum()) for w, lp, e in zip(weights, per_row, ents)).backward()
        grads = torch.cat([p.grad.flatten() for p in policy.model.parameters()])
        results[kind] = (per_row, ents, grads, packed)
    full, shared = results[FullPack], results[PromptPack]
    prompts = {tuple(e.token_ids[: e.is_action.index(True)]) for e in eps}
    assert shared[3].prompt_ids.shape[0] == len(prompts) < len(eps)  # each distinct prompt run once
    for a, b in zip(full[0] + full[1], shared[0] + shared[1]):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)
    assert [len(r) for r in full[0]] == [e.action_tokens for e in eps]
    torch.testing.assert_close(shared[2], full[2], atol=1e-5, rtol=1e-3)
    policy.model.zero_grad(set_to_none=True)


def _graph(fn) -> set[str]:
    seen, todo, names = set(), [fn], set()
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        names.add(type(f).__name__)
        todo += [g for g, _ in f.next_functions]
    return names


def test_the_shared_prompt_backward_is_reproducible(math_setup):
    """Indexing with a tensor backpropagates through index_put_(accumulate=True), which CPU torch runs with
    atomic float adds across threads: the gradient's last bits then depend on thread timing, and two runs of
    the same config drifted apart. The shared-prompt forward repeats rows with index_select (a fixed-order
    sum in the backward): no tensor-indexing node may sit in its graph."""
    policy = math_setup[2]
    eps = _episodes(math_setup, n_tasks=4, g=4, turns=1)
    packed = PromptPack.of(eps, list(range(len(eps))), policy.pad_id)
    logp, _ = pack_logprobs(policy.model, packed, 1.0, entropy=False)
    names = _graph(logp.sum().grad_fn)
    assert "IndexSelectBackward0" in names and "IndexBackward0" not in names, sorted(names)
