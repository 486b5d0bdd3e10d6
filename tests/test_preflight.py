"""Mistakes found only past parsing (a model directory that is not there, a dataset too small for its
splits) stop the command before anything is written: exit code 2, the field named, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml


def run_cli(*args):
    # A time limit: were a mistake missed, the command would go on to train.
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True, timeout=300)


def expect_refused(tmp_path, command: str, sections: dict, needles: list[str]) -> str:
    raw = {
        "run": {"name": "r", "out_dir": str(tmp_path / "runs")},
        # Small and cached under tmp_path, should a missed mistake let it start.
        "policy": {
            "cache_dir": str(tmp_path / "cache"),
            "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "vocab_size": 200},
            "warm_start": {"steps": 1, "demonstrations": 100},
        },
        "train": {"steps": 1},
        "loop": {"max_rounds": 1},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(raw))
    out = run_cli(command, str(f))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    for n in needles:
        assert n in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists()  # not the run directory, not even out_dir
    return out.stderr


@pytest.mark.parametrize(
    "command, make_dir, needles",
    [
        ("run", False, ["policy.path", "/does/not/exist", "not a directory"]),
        ("train", True, ["policy.path", "no config.json"]),
    ],
)
def test_missing_model_directory_is_refused_before_the_run_directory(tmp_path, command, make_dir, needles):
    model = tmp_path / "empty-model" if make_dir else "/does/not/exist"
    if make_dir:
        model.mkdir()
    expect_refused(tmp_path, command, {"policy": {"kind": "hf", "path": str(model)}}, needles)


# Products of one-digit numbers: 100 distinct questions.
PRODUCTS = {"datasets": [{"name": "products", "config": {"min_digits": 1, "max_digits": 1}}]}


def test_dataset_smaller_than_its_splits_is_refused_before_the_run_directory(tmp_path):
    err = expect_refused(
        tmp_path,
        "run",
        {"env": PRODUCTS, "eval": {"heldout_size": 200}},
        ["env.datasets[0]", "products", "100 distinct questions", "eval.heldout_size"],
    )
    assert "about 50" in err  # the number to set


def test_dataset_whose_held_out_set_leaves_little_to_train_on_is_refused(tmp_path):
    err = expect_refused(
        tmp_path,
        "train",
        {"env": PRODUCTS, "eval": {"heldout_size": 80}},
        ["env.datasets[0]", "100 distinct questions", "leaving 20 distinct ones to train on", "eval.heldout_size"],
    )
    assert "env.train_size" in err
