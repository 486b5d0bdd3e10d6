"""Config errors: a clear message naming the field, the value and what is allowed; exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer.config import load_config
from evotrainer.errors import ConfigError
from evotrainer.harness.harness import Harness


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    "yaml_text, needles",
    [
        ("harness:\n  loss:\n    loss_type: ppo\n", ["harness.loss.loss_type", "'ppo'", "grpo", "dr_grpo", "dapo"]),
        ("harness:\n  sampling:\n    temperature: -1\n", ["harness.sampling.temperature", "-1", "greater than 0"]),
        ("train:\n  stepz: 3\n", ["train.stepz", "unknown field"]),
        ("env:\n  domain: chess\n", ["env.domain", "'chess'", "math", "digits"]),
        ("- just\n- a list\n", ["top level must be a mapping"]),
        ("gate:\n  statistic: bootstrap\n", ["gate.statistic", "bootstrap", "use two_stage"]),
    ],
)
def test_bad_field_is_named(tmp_path, yaml_text, needles):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml_text)
    with pytest.raises(ConfigError) as e:
        load_config(f)
    for n in needles:
        assert n in str(e.value)
    out = run_cli("train", str(f))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and needles[0] in out.stderr


def test_cli_missing_file_and_bad_override(tmp_path):
    out = run_cli("train", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "not found" in out.stderr
    f = tmp_path / "ok.yaml"
    f.write_text("{}\n")
    out = run_cli("train", str(f), "--set", "train.steps")
    assert out.returncode == 2 and "KEY=VALUE" in out.stderr
    out = run_cli("train", str(f), "--set", "harness.sampling.num_generations=0")
    assert out.returncode == 2 and "harness.sampling.num_generations" in out.stderr


def test_cli_unknown_reward_term_is_a_user_error(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("harness:\n  reward_weights: {accuracy: 1.0}\n")
    out = run_cli("train", str(f), "--set", f"run.out_dir={tmp_path}")
    assert out.returncode == 2 and "accuracy" in out.stderr and "Traceback" not in out.stderr


def test_harness_version_is_content_hash_plus_parent():
    a, b = Harness(), Harness()
    assert a.version == b.version
    assert Harness(loss={"beta": 0.01}).version != a.version
    assert Harness(parent=a.version).version != a.version


def test_domain_mistake_writes_no_run_directory(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(f"run: {{out_dir: {tmp_path / 'runs'}}}\nenv:\n  datasets: [{{name: no_such_dataset}}]\n")
    out = run_cli("train", str(f))
    assert out.returncode == 2 and "env.datasets[0]" in out.stderr and "no_such_dataset" in out.stderr
    assert not (tmp_path / "runs").exists()


EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples"
EXAMPLES = sorted(EXAMPLE_DIR.rglob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.relative_to(EXAMPLE_DIR).as_posix())
def test_every_example_config_loads(path):
    assert load_config(path).run.name


def test_a_new_run_with_the_uncalibrated_sign_gate_is_refused_before_anything_is_written(tmp_path):
    # `sign` is over its nominal false-promotion rate where a candidate's harness spreads the policy more than the
    # mainline's (benchmarks/gate_calibration.py); a run written with it still reads and resumes (test_old_ledger).
    f = tmp_path / "c.yaml"
    f.write_text(
        f"run: {{out_dir: {tmp_path / 'runs'}}}\nloop: {{max_rounds: 1}}\n"
        "gate: {statistic: sign, aa_control: round}\n"
    )
    out = run_cli("run", str(f))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "gate.statistic" in out.stderr and "use two_stage" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_a_mistyped_field_is_named_before_torch_is_imported(tmp_path):
    """A config mistake is the first thing most users meet: the CLI names the field in well under a second,
    before it loads torch and transformers (seconds), for `train` and `run` alike."""
    f = tmp_path / "bad.yaml"
    f.write_text("train:\n  stepz: 3\n")
    for command in ("train", "run"):
        probe = (
            "import sys\n"
            "from evotrainer.cli.main import main\n"
            f"sys.argv = ['evotrainer', {command!r}, {str(f)!r}]\n"
            "try:\n    main()\n"
            "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)\n"
        )
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        assert out.stdout.strip() == "exit 2 False" and "train.stepz" in out.stderr, (out.stdout, out.stderr)
