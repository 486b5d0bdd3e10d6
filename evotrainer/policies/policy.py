"""The policy contract: sample groups of completions with per-token logprobs, score given tokens,
save / load / fork a checkpoint; and check_policy, which a user's policy must pass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch


@dataclass
class Sample:
    """One sampled action: its token ids (EOS included when sampled), the logprob of each token under
    the sampling distribution, the summed entropy of that distribution, the decoded text, and why
    sampling stopped (`stop`: EOS or a stop string; `length`: max_new_tokens)."""

    token_ids: list[int]
    logprobs: list[float]
    entropy_sum: float
    text: str
    finish_reason: Literal["stop", "length"]


class Policy(Protocol):
    model: torch.nn.Module
    tokenizer: object
    max_positions: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def sample(
        self,
        contexts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: tuple[str, ...] = (),
        greedy: bool = False,
        generator: torch.Generator | None = None,
        fast: bool = False,
    ) -> list[Sample]: ...

    def logprobs(self, sequences: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """Logprob of each token given its prefix (the first token has none), no gradient."""
        ...

    def save(self, path: str | Path) -> None: ...

    def fork(self, path: str | Path) -> Policy:
        """Save to `path` and return an independent policy loaded from it."""
        ...


class PolicyCheckError(AssertionError):
    pass


def check_policy(policy: Policy, contexts: list[list[int]], tmp_dir: str | Path, seed: int = 0) -> None:
    """Seeded sampling is deterministic, sampled logprobs agree with `logprobs`, and a fork scores
    the same tokens identically."""

    def draw() -> list[Sample]:
        g = torch.Generator().manual_seed(seed)
        return policy.sample(contexts, max_new_tokens=6, temperature=1.0, generator=g)

    a, b = draw(), draw()
    if [s.token_ids for s in a] != [s.token_ids for s in b]:
        raise PolicyCheckError("sampling with the same seed gave different tokens")
    seqs = [c + s.token_ids for c, s in zip(contexts, a)]
    scored = policy.logprobs(seqs)
    for c, s, lp in zip(contexts, a, scored):
        got = lp[len(c) - 1 : len(c) - 1 + len(s.token_ids)]
        if any(abs(x - y) > 1e-3 for x, y in zip(got, s.logprobs)):
            raise PolicyCheckError(f"sampled logprobs {s.logprobs[:4]} disagree with scored {got[:4]}")
    twin = policy.fork(Path(tmp_dir) / "fork")
    if any(abs(x - y) > 1e-6 for p, q in zip(scored, twin.logprobs(seqs)) for x, y in zip(p, q)):
        raise PolicyCheckError("a forked policy scores the same tokens differently")
