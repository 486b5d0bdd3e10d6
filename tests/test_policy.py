"""The Hugging Face policy: contract checks, checkpoints, sampling controls, local models and LoRA."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from evotrainer.config import parse_config
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.policies import load_policy
from evotrainer.policies.decoders import SharedPrefixDecoder
from evotrainer.policies.hf import HFPolicy
from evotrainer.policies.policy import check_policy


def contexts(domain, policy, n=6):
    return [policy.encode(t.prompt) for t in domain.tasks("train")[:n]]


def test_check_policy_and_fork_round_trip(math_setup, tmp_path):
    cfg, domain, policy = math_setup
    ctx = contexts(domain, policy)
    check_policy(policy, ctx, tmp_path)
    policy.save(tmp_path / "ckpt")
    loaded = HFPolicy.load(tmp_path / "ckpt")
    seqs = [c + policy.encode("<answer>7</answer>") for c in ctx]
    assert loaded.logprobs(seqs) == policy.logprobs(seqs)  # bit-identical after a round trip
    twin = policy.fork(tmp_path / "twin")
    with torch.no_grad():
        next(twin.model.parameters()).add_(0.5)
    assert twin.logprobs(seqs) != policy.logprobs(seqs)  # a fork is independent of its parent


def test_stop_strings_length_and_greedy(math_setup):
    cfg, domain, policy = math_setup
    ctx = contexts(domain, policy)
    out = policy.sample(ctx, max_new_tokens=12, stop=("</answer>",), greedy=True)
    for s in out:
        assert s.finish_reason == "stop" and s.text.endswith("</answer>")
        assert len(s.token_ids) == len(s.logprobs) <= 12
    cut = policy.sample(ctx, max_new_tokens=2, stop=("</answer>",), greedy=True)
    assert all(s.finish_reason == "length" and len(s.token_ids) == 2 for s in cut)
    # Greedy equals sampling with a vanishing top_p (only the most likely token survives).
    nucleus = policy.sample(
        ctx, max_new_tokens=12, stop=("</answer>",), top_p=1e-6, generator=torch.Generator().manual_seed(1)
    )
    assert [s.token_ids for s in nucleus] == [s.token_ids for s in out]

    # Temperature spreads the distribution: more entropy per token.
    def ent(t):
        ss = policy.sample(
            ctx * 8, max_new_tokens=8, temperature=t, stop=("</answer>",), generator=torch.Generator().manual_seed(0)
        )
        return sum(s.entropy_sum for s in ss) / sum(len(s.token_ids) for s in ss)

    assert ent(2.0) > ent(0.5)


def test_sampling_matches_generate_greedy(math_setup):
    """Our cached sampler, which drops finished rows, decodes what transformers' generate decodes."""
    cfg, domain, policy = math_setup
    ctx = contexts(domain, policy, 5) + [policy.encode("x")]
    ours = policy.sample(ctx, max_new_tokens=8, greedy=True)
    from evotrainer.policies.hf import left_pad

    ids, mask = left_pad(ctx, policy.pad_id)
    ref = policy.model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=policy.pad_id,
        eos_token_id=policy.eos_id,
    )[:, ids.shape[1] :]
    for s, row in zip(ours, ref.tolist()):
        assert s.token_ids == row[: len(s.token_ids)]


def test_a_group_batch_records_the_model_s_own_logprobs(math_setup):
    """A GRPO step's batch (each prompt repeated for its group) samples through the shared-prefix decoder,
    which keeps a prompt's cache once for its group; each token's recorded logprob is the model's own, rows
    that stop early included, so the update's importance ratio starts at 1."""
    cfg, domain, policy = math_setup
    prompts = [t.prompt for t in domain.tasks("train")[:2]]
    prompts += ["Next one. " + prompts[0], "And then, without a word more, " + prompts[1]]  # left padding differs
    ctx = [policy.encode(p) for p in prompts for _ in range(4)]
    assert len({len(c) for c in ctx}) > 1
    assert isinstance(policy._prefill(policy.model, ctx, 12)[0], SharedPrefixDecoder)
    out = policy.sample(ctx, max_new_tokens=12, stop=("</answer>",), generator=torch.Generator().manual_seed(3))
    assert len({len(s.token_ids) for s in out}) > 1  # rows finished at different steps and left the batch
    truth = policy.logprobs([c + s.token_ids for c, s in zip(ctx, out)])
    for s, lp in zip(out, truth):
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(lp[-len(s.token_ids) :]), atol=1e-4, rtol=0)


def test_local_model_directory_and_lora(tmp_path, math_setup):
    cfg, domain, policy = math_setup
    # A small model saved the ordinary Hugging Face way, then loaded with kind: hf.
    model_dir = tmp_path / "hf-model"
    policy.model.save_pretrained(model_dir)
    policy.tokenizer.save_pretrained(model_dir)
    assert AutoModelForCausalLM.from_pretrained(model_dir) is not None
    raw = cfg.model_dump(mode="json")
    raw["policy"] = {"kind": "hf", "path": str(model_dir), "lora_rank": 4}
    lora_cfg = parse_config(raw)
    lora = load_policy(lora_cfg.policy, d := make_domain(lora_cfg), lora_cfg.run.seed, warm_start_key(lora_cfg, d))
    trainable = [n for n, p in lora.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)
    ctx = contexts(domain, lora)
    seqs = [c + lora.encode("<answer>3</answer>") for c in ctx]
    assert lora.logprobs(seqs) == policy.logprobs(seqs)  # LoRA starts as the identity
    # The adapter samples through transformers' cache, the plain model through our own decoder: same tokens.
    greedy = [p.sample(ctx * 2, max_new_tokens=8, stop=("</answer>",), greedy=True) for p in (lora, policy)]
    assert [s.token_ids for s in greedy[0]] == [s.token_ids for s in greedy[1]]
    with torch.no_grad():
        for n, p in lora.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.01)
    moved = lora.logprobs(seqs)
    assert moved != policy.logprobs(seqs)
    twin = lora.fork(tmp_path / "lora-ckpt")
    assert twin.logprobs(seqs) == moved
    assert (tmp_path / "lora-ckpt" / "adapter_config.json").exists()


def test_warm_started_base_is_cached_by_recipe(math_setup):
    from evotrainer.policies.tiny import tiny_base

    cfg, domain, policy = math_setup
    said = []
    path = tiny_base(cfg.policy, domain, warm_start_key(cfg, domain), cfg.run.seed, log=said.append)
    assert said and said[0].startswith("warm-started base: reusing")
    other = cfg.policy.model_copy(update={"warm_start": cfg.policy.warm_start.model_copy(update={"steps": 151})})
    from evotrainer.policies.tiny import recipe_hash

    assert recipe_hash(other, warm_start_key(cfg, domain), cfg.run.seed) != recipe_hash(
        cfg.policy, warm_start_key(cfg, domain), cfg.run.seed
    )
    assert path.name.endswith(recipe_hash(cfg.policy, warm_start_key(cfg, domain), cfg.run.seed))


def test_building_a_warm_start_says_so_as_it_goes(math_setup, tmp_path):
    """With no progress bar (the loop, a log file) the warm start said nothing for minutes: a reader could not
    tell slow from stuck. It says what it builds, then its loss at every tenth of its steps."""
    from evotrainer.policies.tiny import tiny_base

    cfg, domain, _ = math_setup
    warm = cfg.policy.warm_start.model_copy(update={"steps": 20, "demonstrations": 200})
    fresh = cfg.policy.model_copy(update={"cache_dir": tmp_path, "warm_start": warm})
    said: list[str] = []
    tiny_base(fresh, domain, warm_start_key(cfg, domain), cfg.run.seed, log=said.append)
    assert said[0].startswith("warm-started base: none cached for this recipe; building it (200 demonstrations")
    steps = [line for line in said if line.startswith("warm start: step ")]
    assert [line.split()[3].rstrip(",") for line in steps] == [f"{k}/20" for k in range(2, 21, 2)]
    assert said[-1].startswith("warm-started base: built in")
