"""Throughput, side by side in one run on the same model and prompts:
(1) our KV-cache sampler vs a plain `model.generate` call, with and without a stop string;
(2) one GRPO step (sample + update) of our trainer vs TRL's GRPOTrainer with matching settings;
(3) with --sample-dtype bfloat16: our sampler and our GRPO step with a bfloat16 sampling copy
(policy.sample_dtype) against float32, and the sampler/trainer mismatch the copy costs.

    python -m benchmarks.throughput [--config examples/math_train.yaml] [--steps 8] [--repeats 5]
                                    [--sample-dtype bfloat16] [--no-trl]

The tiny default policy by default; `--config examples/smollm2_math.yaml` measures the pretrained
SmolLM2-135M-Instruct (LoRA, chat template, answers in free text, EOS ends a completion). Prints a Markdown
table of tokens/s and ratios and writes benchmarks/results/throughput-NAME.json with its manifest.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.manifest import write_result
from benchmarks.paths import RESULTS, ROOT, scratch
from benchmarks.tables import markdown_table
from evotrainer.config import load_config
from evotrainer.envs.registry import make_domain, warm_start_key
from evotrainer.envs.single_turn import free_answer
from evotrainer.harness.harness import Harness
from evotrainer.policies import load_policy
from evotrainer.policies.hf import HFPolicy, left_pad
from evotrainer.training.grpo import GRPOTrainer
from evotrainer.training.segment import StepContext, step_tasks, train_step
from evotrainer.types import Turn


def bench_sampling(
    policy: HFPolicy, contexts: list[list[int]], max_new: int, stop: tuple[str, ...], repeats: int
) -> tuple[float, float]:
    """tokens/s of ours and of generate; only tokens up to each row's end count, on both sides."""
    ids, mask = left_pad(contexts, policy.pad_id)
    ours, theirs = [], []

    def run_ours(r: int) -> None:
        t0 = time.perf_counter()
        out = policy.sample(contexts, max_new_tokens=max_new, stop=stop, generator=torch.Generator().manual_seed(r))
        ours.append(sum(len(s.token_ids) for s in out) / (time.perf_counter() - t0))

    def run_generate(r: int) -> None:
        torch.manual_seed(r)
        t0 = time.perf_counter()
        with torch.no_grad():
            gen = policy.model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=max_new,
                pad_token_id=policy.pad_id,
                eos_token_id=policy.eos_id,
                stop_strings=list(stop) or None,
                tokenizer=policy.tokenizer if stop else None,
            )
        dt = time.perf_counter() - t0
        n = 0
        for row in gen[:, ids.shape[1] :].tolist():  # count a row's tokens up to its stop: generate pads after it
            k = len(row)
            if stop:
                for j in range(1, len(row) + 1):
                    if any(s in policy.tokenizer.decode(row[:j], skip_special_tokens=True) for s in stop):
                        k = j
                        break
            n += k
        theirs.append(n / dt)

    # Alternate which goes first: the second of two back-to-back runs is measurably favoured here.
    for r in range(repeats):
        for fn in (run_ours, run_generate) if r % 2 == 0 else (run_generate, run_ours):
            fn(r)
    return statistics.median(ours), statistics.median(theirs)


def bench_ours(policy: HFPolicy, domain, harness: Harness, steps: int, metrics: list | None = None) -> float:
    trainer = GRPOTrainer(policy, harness)
    ctx = StepContext("bench", "bench", 0)
    times = []
    for step in range(1, steps + 2):
        t0 = time.perf_counter()
        m = train_step(trainer, domain, domain.tasks("train"), ctx, step)
        times.append((time.perf_counter() - t0, m["tokens_generated"]))
        if metrics is not None:
            metrics.append(m)
    dt = statistics.median(t for t, _ in times[1:])
    tok = statistics.median(n for _, n in times[1:])
    return tok / dt


def bench_low_precision(policy: HFPolicy, domain, harness: Harness, contexts, args) -> tuple[list, dict]:
    """Rows of ours with a `sample_dtype` sampling copy against ours in the policy's dtype (sampler, then a
    GRPO step each, interleaved), and the mismatch the copy's logprobs had in the update (its step metrics)."""
    s = harness.sampling
    exact = policy.fork(str(scratch("evotrainer-bench-exact")))
    low = HFPolicy.load(
        scratch("evotrainer-bench-exact"), placement=replace(policy.placement, sample_dtype=args.sample_dtype)
    )
    fast, slow = [], []
    for r in range(args.repeats):
        for p, out, f in (
            ((low, fast, True), (exact, slow, False)) if r % 2 == 0 else ((exact, slow, False), (low, fast, True))
        ):
            t0 = time.perf_counter()
            got = p.sample(
                contexts,
                max_new_tokens=s.max_completion_length,
                stop=domain.stop,
                fast=f,
                generator=torch.Generator().manual_seed(r),
            )
            out.append(sum(len(x.token_ids) for x in got) / (time.perf_counter() - t0))
    # The GRPO steps interleaved too (which goes first alternates), so a change in the machine's load falls
    # on both: step 0 of each is a warm-up (the copy is made there) and not counted.
    plain, seen = NoStop(domain), []
    trainers = {True: GRPOTrainer(low, harness), False: GRPOTrainer(exact, harness)}
    rates: dict[bool, list[float]] = {True: [], False: []}
    ctx = StepContext("bench", "bench", 0)
    for step in range(1, args.steps + 2):
        for f in (True, False) if step % 2 else (False, True):
            t0 = time.perf_counter()
            m = train_step(trainers[f], plain, plain.tasks("train"), ctx, step)
            if step > 1:
                rates[f].append(m["tokens_generated"] / (time.perf_counter() - t0))
            if f:
                seen.append(m)
    step_low, step_f32 = statistics.median(rates[True]), statistics.median(rates[False])
    key = "sampling/sampling_logp_difference"
    mismatch = {
        "mean_abs_logp_difference": statistics.mean(m[f"{key}/mean"] for m in seen),
        "max_abs_logp_difference": max(m[f"{key}/max"] for m in seen),
        "importance_ratio_min": min(m["sampling/importance_sampling_ratio/min"] for m in seen),
        "importance_ratio_max": max(m["sampling/importance_sampling_ratio/max"] for m in seen),
        "steps": len(seen),
    }
    n = f"({len(contexts)} seqs, max {s.max_completion_length} new)"
    return [
        (
            f"sampling, {args.sample_dtype} copy {n}",
            statistics.median(fast),
            f"ours, {policy.placement.dtype}",
            statistics.median(slow),
        ),
        (f"GRPO step, {args.sample_dtype} sampling copy", step_low, f"ours, {policy.placement.dtype}", step_f32),
    ], mismatch


def bench_trl(policy: HFPolicy, domain, harness: Harness, steps: int) -> float:
    # TRL is a dev dependency, imported here only (after its warning switch, which it reads on import).
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig
    from trl import GRPOTrainer as TRLGRPOTrainer

    s = harness.sampling
    tasks = [t for step in range(1, steps + 2) for t in step_tasks(domain.tasks("train"), s.prompts_per_step, 0, step)]
    # A chat model gets TRL's conversational prompts (TRL applies the template), as our sampler renders them.
    rows = [
        {"prompt": [{"role": "user", "content": t.prompt}] if policy.chat else t.prompt, "task_index": i}
        for i, t in enumerate(tasks)
    ]
    data = Dataset.from_list(rows)

    def text(c) -> str:
        return c[-1]["content"] if isinstance(c, list) else c

    def correct(completions, task_index, **kw):
        return [
            domain.correct(tasks[i], [Turn(text(c), 0, 0.0)], {"answer": free_answer(text(c))})
            for c, i in zip(completions, task_index)
        ]

    stamps: list[tuple[float, float]] = []

    class Clock(TrainerCallback):  # a step's end and the mean completion length TRL logged for it
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                stamps.append((time.perf_counter(), logs["completions/mean_length"]))

    cfg = GRPOConfig(
        output_dir=str(scratch("evotrainer-bench-trl")),
        use_cpu=True,
        bf16=False,
        num_generations=s.num_generations,
        per_device_train_batch_size=s.num_generations * s.prompts_per_step,
        max_completion_length=s.max_completion_length,
        temperature=s.temperature,
        top_p=s.top_p,
        learning_rate=harness.optimizer.learning_rate,
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type=harness.loss.loss_type,
        max_steps=steps + 1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        shuffle_dataset=False,
        disable_tqdm=True,
        max_grad_norm=harness.optimizer.max_grad_norm,
        seed=0,
    )
    model = copy.deepcopy(policy.model)
    trainer = TRLGRPOTrainer(
        model=model, reward_funcs=correct, args=cfg, train_dataset=data, processing_class=policy.tokenizer
    )
    trainer.add_callback(Clock())
    t0 = time.perf_counter()
    trainer.train()
    ends = [t0] + [t for t, _ in stamps]
    # Tokens a step sampled (TRL's logged mean length x completions: a real model stops at EOS) over its time.
    rates = [s.num_generations * s.prompts_per_step * n / (b - a) for a, b, (_, n) in zip(ends, ends[1:], stamps)]
    return statistics.median(rates[1:])


class NoStop:
    """The domain with its stop strings removed, so both trainers sample exactly max_completion_length
    tokens (TRL stops only at EOS, which the tiny model never emits): equal work per step."""

    def __init__(self, domain):
        self._d = domain
        self.stop = ()

    def __getattr__(self, name):
        return getattr(self._d, name)


def against_generate_and_trl(policy: HFPolicy, domain, h: Harness, contexts, args) -> list:
    s = h.sampling
    rows = []
    stops = " / ".join(f"`{x}`" for x in domain.stop) or "EOS"
    for label, stop, max_new in (
        (f"stop at {stops}", domain.stop, s.max_completion_length),
        ("fixed length, no stop", (), 32),
    ):
        ours, gen = bench_sampling(policy, contexts, max_new, stop, args.repeats)
        rows.append((f"sampling, {label} ({len(contexts)} seqs, max {max_new} new)", ours, "generate", gen))
    plain = NoStop(domain)
    ours = bench_ours(policy.fork(str(scratch("evotrainer-bench-ours"))), plain, h, args.steps)
    trl = bench_trl(policy, plain, h, args.steps)
    rows.append(
        (
            f"GRPO step, sample + update ({len(contexts)} seqs x {s.max_completion_length} tokens, "
            f"{h.loss.loss_type})",
            ours,
            "TRL GRPOTrainer",
            trl,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "math_train.yaml"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sample-dtype", choices=["bfloat16", "float16"], default=None)
    ap.add_argument("--no-trl", action="store_true", help="skip generate and TRL (only the --sample-dtype rows)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    cfg = load_config(args.config)
    domain = make_domain(cfg)
    policy = load_policy(cfg.policy, domain, cfg.run.seed, warm_start_key(cfg, domain))
    h = cfg.harness
    s = h.sampling
    tasks = [t for t in step_tasks(domain.tasks("train"), s.prompts_per_step, 0, 1) for _ in range(s.num_generations)]
    contexts = [policy.encode_prompt(t.prompt) for t in tasks]
    n_params = sum(p.numel() for p in policy.model.parameters())
    rows = []
    if not args.no_trl:
        rows += against_generate_and_trl(policy, domain, h, contexts, args)
    mismatch = None
    if args.sample_dtype:
        low_rows, mismatch = bench_low_precision(policy, domain, h, contexts, args)
        rows += low_rows
    model = cfg.policy.pretrained or cfg.policy.path or "tiny Llama"
    lora = f", LoRA rank {cfg.policy.lora_rank}" if cfg.policy.lora_rank else ""
    about = (
        f"model: {model} {n_params / 1e6:.1f}M params{lora}, {cfg.policy.dtype}; torch threads 2, CPU kernels "
        f"{torch.backends.cpu.get_cpu_capability()}; "
        f"median of {args.repeats} sampling repeats, {args.steps} GRPO steps after 1 warm-up"
    )
    print(f"\n{about}\n")
    lines = [[name, f"{a:,.0f}", base, f"{b:,.0f}", f"{a / b:.2f}x"] for name, a, base, b in rows]
    print(markdown_table(["measurement", "ours (tokens/s)", "baseline", "baseline (tokens/s)", "ratio"], lines))
    if mismatch:
        print(f"\nthe {args.sample_dtype} copy's mismatch in the update: {mismatch}")
    out = RESULTS / f"throughput-{Path(args.config).stem}{'-' + args.sample_dtype if args.sample_dtype else ''}.json"
    result = {
        **({"sampling_mismatch": mismatch} if mismatch else {}),
        "about": about,
        "rows": [
            {"measurement": n, "ours": a, "baseline": base, "theirs": b, "ratio": a / b} for n, a, base, b in rows
        ],
    }
    write_result(
        out,
        result,
        configs=[args.config],
        note="python -m benchmarks.throughput " + " ".join(sys.argv[1:] if argv is None else argv),
    )


if __name__ == "__main__":
    main()
