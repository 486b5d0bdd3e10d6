"""The embedded default policy: a tiny Llama-style model and a BPE tokenizer built locally from the
domain's demonstrations, warm-started by supervised training, cached by a hash of its recipe."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import string
import time
from pathlib import Path

import torch
from rich.progress import Progress
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from evotrainer.config import PolicySection
from evotrainer.envs.env import Domain
from evotrainer.policies.hf import HFPolicy, sequence_logprobs

# Bump when the recipe's code changes meaning, so old cached bases are not reused.
RECIPE_VERSION = 2
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]


def build_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """BPE with individual digits. Metaspace must come before Digits, or digits get a space marker."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(prepend_scheme="never", split=False),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tok.decoder = decoders.Metaspace(prepend_scheme="never", split=False)
    alphabet = list(string.printable) + ["▁"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # padding_side must be given at construction: transformers 5 does not persist it when set later.
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    max_positions: int,
    seed: int,
) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=int(hidden_size * 8 / 3) // 8 * 8,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(cfg).float()


def demonstrations(domain: Domain, n: int, seed: int) -> list[list[tuple[str, bool]]]:
    rng = random.Random(seed)
    tasks = domain.tasks("train")
    return [domain.demonstration(tasks[rng.randrange(len(tasks))], rng) for _ in range(n)]


def encode_segments(policy: HFPolicy, segments: list[tuple[str, bool]]) -> tuple[list[int], list[bool]]:
    """Token ids of a transcript and which are actions. Each segment is encoded on its own, as the
    episode runner does, so supervised and RL sequences tokenize identically."""
    ids: list[int] = []
    is_action: list[bool] = []
    for text, action in segments:
        t = policy.encode(text)
        ids += t
        is_action += [action] * len(t)
    return ids, is_action


def supervised(
    policy: HFPolicy,
    demos: list[list[tuple[str, bool]]],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    progress: Progress | None = None,
    log=None,
) -> list[float]:
    """Cross-entropy on action tokens only (prompts and observations are context). Without a progress bar,
    `log` is told the loss at every tenth of the steps: a warm start takes minutes, and a log that says
    nothing for minutes cannot tell slow from stuck."""
    encoded = [encode_segments(policy, d) for d in demos]
    rng = random.Random(seed)
    opt = torch.optim.AdamW(policy.model.parameters(), lr=learning_rate, betas=(0.9, 0.99), weight_decay=0.0)
    policy.model.train()
    losses = []
    task = progress.add_task("warm start", total=steps) if progress else None
    t0, every = time.time(), max(1, steps // 10)
    for step in range(steps):
        batch = [encoded[rng.randrange(len(encoded))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((batch_size, width), policy.pad_id, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        target = torch.zeros((batch_size, width), dtype=torch.bool)
        for i, (seq, act) in enumerate(batch):
            ids[i, : len(seq)] = torch.tensor(seq)
            mask[i, : len(seq)] = 1
            target[i, : len(seq)] = torch.tensor(act)
        logp = sequence_logprobs(policy.model, ids, mask)
        tmask = target[:, 1:].float()
        loss = -(logp * tmask).sum() / tmask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if progress:
            progress.update(task, advance=1, description=f"warm start (loss {loss.item():.3f})")
        elif log is not None and ((step + 1) % every == 0 or step + 1 == steps):
            log(f"warm start: step {step + 1}/{steps}, loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    return losses


def recipe_hash(cfg: PolicySection, domain_key: dict, seed: int) -> str:
    recipe = {
        "v": RECIPE_VERSION,
        "tiny": cfg.tiny.model_dump(),
        "warm_start": cfg.warm_start.model_dump(),
        "domain": domain_key,
        "seed": seed,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cache_root(cfg: PolicySection) -> Path:
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    return Path(os.environ.get("EVOTRAINER_CACHE", Path.home() / ".cache" / "evotrainer"))


def tiny_base(
    cfg: PolicySection, domain: Domain, domain_key: dict, seed: int, progress: Progress | None = None, log=print
) -> Path:
    """Build (or reuse from the cache) the warm-started tiny base for this domain and recipe; its path."""
    key = recipe_hash(cfg, domain_key, seed)
    path = cache_root(cfg) / "bases" / f"{domain.name}-{key}"
    if (path / "config.json").exists():
        log(f"warm-started base: reusing {path}")
        return path
    log(
        f"warm-started base: none cached for this recipe; building it ({cfg.warm_start.demonstrations} "
        f"demonstrations, {cfg.warm_start.steps} supervised steps), once, for every later run with this recipe"
    )
    t0 = time.time()
    demos = demonstrations(domain, cfg.warm_start.demonstrations, seed)
    corpus = ["".join(text for text, _ in d) for d in demos[:5000]]
    tok = build_tokenizer(corpus, cfg.tiny.vocab_size)
    t = cfg.tiny
    policy = HFPolicy(build_model(tok, t.hidden_size, t.num_layers, t.num_heads, t.max_positions, seed), tok)
    losses = supervised(
        policy,
        demos,
        steps=cfg.warm_start.steps,
        batch_size=cfg.warm_start.batch_size,
        learning_rate=cfg.warm_start.learning_rate,
        seed=seed,
        progress=progress,
        log=log,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    # Build under a private name, then rename: two runs racing for one recipe never see half a base.
    tmp = path.with_name(f"{path.name}.{os.getpid()}")
    policy.save(tmp)
    (tmp / "warm_start.json").write_text(
        json.dumps({"seconds": time.time() - t0, "final_loss": losses[-1] if losses else None})
    )
    try:
        tmp.rename(path)
    except OSError:  # another process finished first; theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"warm-started base: built in {time.time() - t0:.0f}s, cached at {path}")
    return path
