"""Runs trained elsewhere: a real trl.GRPOTrainer run's completion logs and verl-format rollout dumps imported and
diagnosed (a planted failure found, its evidence in the store), the TRL callback beside a real GRPOTrainer run,
and a directory without the expected files refused naming them."""

from __future__ import annotations

import json
import logging
import random
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from evotrainer.cli.main import main
from evotrainer.integrations.trl_callback import DiagnosticsCallback
from evotrainer.policies.tiny import build_model, build_tokenizer
from evotrainer.store.files import sql_list
from evotrainer.store.rollouts import RolloutStore

CAP = 2
"""max_completion_length of the planted failure: an untrained model ends a completion (EOS among 200 tokens) within
two tokens rarely, so TRL cuts nearly every one, and the truncation detector (above 10% of rollouts) must fire."""


def correct(completions, answer, **_) -> list[float]:
    return [float(c.strip() == f"<answer>{a}</answer>") for c, a in zip(completions, answer)]


def tag(completions, **_) -> list[float]:
    return [float(c.startswith("<answer>")) for c in completions]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The tiny policy's architecture and tokenizer (policies/tiny.py), untrained: a cut at CAP tokens needs no
    skill, and the tests need no warm start. Its directory and a dataset of sums."""
    rows = [
        {"prompt": f"What is {a} + {b}? Answer in <answer></answer>.", "answer": str(a + b)}
        for a in range(4)
        for b in range(4)
    ]
    tok = build_tokenizer([r["prompt"] + f" <answer>{r['answer']}</answer>" for r in rows] * 8, 200)
    d = tmp_path_factory.mktemp("tiny")
    build_model(tok, hidden_size=64, num_layers=2, num_heads=2, max_positions=256, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d, rows


def grpo_trainer(tiny, tmp: Path, steps: int, **args) -> GRPOTrainer:
    """A real GRPOTrainer on a fresh copy of the tiny model: 2 prompts x 4 completions a step."""
    d, rows = tiny
    config = GRPOConfig(
        output_dir=str(tmp / "trl-out"),
        max_steps=steps,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=CAP,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        **args,
    )
    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(d),
        reward_funcs=[correct, tag],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(d),
    )


def cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`evotrainer ARGS` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["evotrainer", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def findings(monkeypatch, capsys, run: Path) -> list[dict]:
    code, out, err = cli(monkeypatch, capsys, "diagnose", str(run), "--json")
    assert code == 0, err
    return json.loads(out)


def assert_cited_in_store(run: Path, finding: dict, termination: str | None = None) -> None:
    ids = finding["evidence"]
    rows = RolloutStore(run / "store").query(f"id IN {sql_list(ids)}")
    assert ids and sorted(r["id"] for r in rows) == sorted(ids)
    if termination:
        assert all(r["termination"] == termination for r in rows)


@pytest.fixture(scope="module")
def trl_run(tiny, tmp_path_factory) -> Path:
    """A TRL output_dir as TRL writes it: completion tables (log_completions), checkpoints with trainer_state.json
    and the tokenizer."""
    tmp = tmp_path_factory.mktemp("trl")
    trainer = grpo_trainer(tiny, tmp, 2, log_completions=True, save_strategy="steps", save_steps=1)
    trainer.train()
    return tmp / "trl-out"


def test_a_trl_run_imported_and_diagnosed(trl_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "runs" / "trl"
    code, out, err = cli(monkeypatch, capsys, "import", "trl", str(trl_run), "--run", str(run))
    assert code == 0, err
    assert "imported 16 rollouts of 2 step(s)" in out and f"max_completion_length {CAP}" in out
    store = RolloutStore(run / "store")
    rows = store.query()
    assert {r["step"] for r in rows} == {1, 2} and set(rows[0]["rewards"]) == {"correct", "tag"}
    groups = {}
    for r in rows:
        groups.setdefault(r["group_id"], set()).add(r["prompt"])
    assert len(groups) == 4 and all(len(p) == 1 for p in groups.values())  # 2 prompts x 4 completions a step
    m = store.metrics("main")
    assert {"entropy", "completions/clipped_ratio", "rewards/tag/mean"} <= set(m[1])
    cut = sum(r["termination"] == "length" for r in rows if r["step"] == 1)
    assert cut == round(m[1]["completions/clipped_ratio"] * 8)  # TRL's own count of cut completions
    [trunc] = [f for f in findings(monkeypatch, capsys, run) if f["name"] == "truncation"]
    assert_cited_in_store(run, trunc, "length")
    # The other readers: the report links the evidence to its text; a replayable intervention replays.
    code, _, err = cli(monkeypatch, capsys, "report", str(run))
    page = (run / "report.html").read_text()
    assert code == 0 and "truncation" in page and all(f'id="r-{i}"' in page for i in trunc["evidence"]), err
    iv = tmp_path / "iv.yaml"
    hypothesis = {"finding": "truncation", "signal": "completions/clipped_ratio", "direction": "down"}
    iv.write_text(
        yaml.safe_dump(
            {"kind": "set_reward_weight", "target": "reward_weights.tag", "value": 0.0, "hypothesis": hypothesis}
        )
    )
    code, out, err = cli(monkeypatch, capsys, "backtest", str(run), "--intervention", str(iv), "--json")
    assert code == 0 and json.loads(out)["rollouts"] == 16, err
    code, _, err = cli(monkeypatch, capsys, "eval", str(run))
    assert code == 2 and "imported from trl" in err


def test_trl_tables_alone_need_the_cap_and_the_tokenizer(trl_run, tmp_path, monkeypatch, capsys):
    """Without trainer_state.json the cut share is unknown and said to be; the cap and tokenizer given, it is known."""
    shutil.copytree(trl_run / "completions", tmp_path / "completions")
    run = tmp_path / "runs" / "bare"
    code, out, err = cli(monkeypatch, capsys, "import", "trl", str(tmp_path / "completions"), "--run", str(run))
    assert code == 0 and "the token cap is unknown" in out, err
    assert RolloutStore(run / "store").count("termination = 'length'") == 0
    again = cli(monkeypatch, capsys, "import", "trl", str(tmp_path / "completions"), "--run", str(run))
    assert again[0] == 2 and "--overwrite" in again[2]  # one store, one run
    tokenizer = next(trl_run.glob("checkpoint-*"))
    code, out, err = cli(
        monkeypatch, capsys, "import", "trl", str(tmp_path / "completions"), "--run", str(run), "--overwrite",
        "--tokenizer", str(tokenizer), "--max-completion-length", str(CAP), "--reward-weight", "tag=0.5",
    )  # fmt: skip
    assert code == 0, err
    # Of 16: the planted cap cuts (nearly) all; a re-encoded text may come out shorter than it was sampled.
    assert RolloutStore(run / "store").count("termination = 'length'") > 4
    assert any(f["name"] == "truncation" for f in findings(monkeypatch, capsys, run))
    assert yaml.safe_load((run / "config.yaml").read_text())["harness"]["reward_weights"] == {
        "correct": 1.0,
        "tag": 0.5,
    }


def dump_generations(global_steps, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
    """verl's RayPPOTrainer._dump_generations as it is at volcengine/verl b178a3cd
    (verl/trainer/ppo/ray_trainer.py), `self.global_steps` made an argument and its closing print left out."""
    import os

    os.makedirs(dump_path, exist_ok=True)
    filename = os.path.join(dump_path, f"{global_steps}.jsonl")

    n = len(inputs)
    base_data = {
        "input": inputs,
        "output": outputs,
        "gts": gts,
        "score": scores,
        "step": [global_steps] * n,
    }

    for k, v in reward_extra_infos_dict.items():
        if len(v) == n:
            base_data[k] = v

    lines = []
    for i in range(n):
        entry = {k: v[i] for k, v in base_data.items()}
        lines.append(json.dumps(entry, ensure_ascii=False))

    with open(filename, "w") as f:
        f.write("\n".join(lines) + "\n")


def verl_dumps(d: Path, steps: int = 3) -> None:
    """Four prompts x four responses a step, in verl's balanced (shuffled) order. Planted: three prompts in four
    are hopeless (every response scores 0), and one response in four runs past the 8-token cap."""
    rng = random.Random(0)
    for step in range(1, steps + 1):
        rows = []
        for p in range(4):
            for k in range(4):
                long = k == 3
                out = "so the sum is " * 3 + "<answer>7</answer>" if long else f"<answer>{p + k}</answer>"
                score = float(p == 0 and k % 2 == 0)
                rows.append((f"user\nWhat is {p} + {step}?\nassistant\n", out, str(p + step), score))
        rng.shuffle(rows)
        inputs, outputs, gts, scores = (list(c) for c in zip(*rows))
        extra = {"acc": [s > 0 for s in scores], "pred": [o[-12:] for o in outputs], "short": [0.0]}  # short: dropped
        dump_generations(step, inputs, outputs, gts, scores, extra, str(d))


def test_a_verl_dump_imported_and_diagnosed(tmp_path, monkeypatch, capsys):
    verl_dumps(tmp_path / "rollout_data")
    run = tmp_path / "runs" / "verl"
    code, out, err = cli(
        monkeypatch, capsys, "import", "verl", str(tmp_path / "rollout_data"), "--run", str(run),
        "--max-response-length", "8",
    )  # fmt: skip
    assert code == 0 and "imported 48 rollouts of 3 step(s)" in out, err
    rows = RolloutStore(run / "store").query()
    assert set(rows[0]["rewards"]) == {"score", "acc"} and "pred" in rows[0]["info"] and "gts" in rows[0]["info"]
    by_group = {}
    for r in rows:
        by_group.setdefault(r["group_id"], []).append(r)
    assert len(by_group) == 12 and all(len({r["prompt"] for r in g}) == 1 and len(g) == 4 for g in by_group.values())
    found = {f["name"]: f for f in findings(monkeypatch, capsys, run)}
    assert {"zero_variance_groups", "truncation"} <= set(found)
    assert_cited_in_store(run, found["truncation"], "length")
    assert_cited_in_store(run, found["zero_variance_groups"])
    dead = RolloutStore(run / "store").query(f"id IN {sql_list(found['zero_variance_groups']['evidence'])}")
    assert all(r["reward"] == 0.0 and not r["prompt"].startswith("user\nWhat is 0 ") for r in dead)


@pytest.mark.parametrize(
    ("kind", "make", "expected"),
    [
        ("trl", lambda d: (d / "checkpoint-1").mkdir(), "completions_STEP.parquet"),
        ("verl", lambda d: (d / "rollouts.jsonl").write_text("{}\n"), "STEP.jsonl"),
        ("verl", lambda d: (d / "3.jsonl").write_text('{"input": "q", "output": "a"}\n'), "3.jsonl:1: no score"),
    ],
)
def test_a_directory_without_the_expected_files_is_refused(tmp_path, monkeypatch, capsys, kind, make, expected):
    src = tmp_path / "src"
    src.mkdir()
    make(src)
    code, _, err = cli(monkeypatch, capsys, "import", kind, str(src), "--run", str(tmp_path / "runs" / "x"))
    assert code == 2 and expected in err and "Traceback" not in err, err
    assert not (tmp_path / "runs" / "x").exists()


def test_the_callback_records_and_diagnoses_a_users_run(tiny, tmp_path, monkeypatch, capsys, caplog):
    trainer = grpo_trainer(tiny, tmp_path, 3, save_strategy="no")
    callback = DiagnosticsCallback(trainer, tmp_path / "runs" / "mine", every=2)
    trainer.add_callback(callback)
    with caplog.at_level(logging.WARNING, logger="evotrainer"):
        trainer.train()
    run = tmp_path / "runs" / "mine"
    store = RolloutStore(run / "store")
    assert callback.steps == [1, 2, 3] and store.count() == 24
    [trunc] = [f for f in callback.findings if f.name == "truncation"]
    assert (trunc.first_step, trunc.last_step) == (1, 3)  # the closing diagnosis, after steps 1-2's
    assert_cited_in_store(run, {"evidence": list(trunc.evidence)}, "length")
    assert any("truncation" in r.getMessage() and trunc.evidence[0] in r.getMessage() for r in caplog.records)
    logged = [e for e in trainer.state.log_history if "evotrainer/findings" in e]
    assert [e["step"] for e in logged] == [2, 3] and all(e["evotrainer/truncation"] > 0.1 for e in logged)
    assert json.loads((run / "summary.json").read_text())["imported_from"] == "trl-callback"
    # The run directory reads as an imported one: diagnose finds the same, the report shows it.
    assert any(f["name"] == "truncation" for f in findings(monkeypatch, capsys, run))
    assert cli(monkeypatch, capsys, "report", str(run))[0] == 0
