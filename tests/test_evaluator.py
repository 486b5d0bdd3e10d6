"""The evaluator's identity: everything that can change an outcome is in its hash (code, settings, hidden
data, versions), and a run that finds a different evaluator at the gate, at the final read or on resume
stops and says what changed."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from conftest import small_config
from evotrainer import evaluation
from evotrainer.envs.registry import make_domain
from evotrainer.errors import EvaluatorChanged
from evotrainer.evaluation import evaluator_identity, identity_hash, what_changed
from evotrainer.loop import run_loop
from evotrainer.stages.start import expect_evaluator, open_run
from evotrainer.store.ledger import Ledger


def test_settings_hidden_data_and_versions_are_in_the_identity(tmp_path):
    cfg = small_config(tmp_path)
    domain = make_domain(cfg)
    tasks = domain.tasks("heldout")[:20]
    base = evaluator_identity(domain, tasks, cfg.eval)
    assert {"settings:eval", "settings:domain", "data:tasks", "version:torch", "version:reasoning-gym"} <= set(base)
    assert any(k.startswith("code:") and k.endswith("training/rollout.py") for k in base)  # the episode runner
    assert any(k.startswith("code:") and k.endswith("policies/hf.py") for k in base)  # decoding
    assert any(k.startswith("code:") and k.endswith("policies/decoders.py") for k in base)  # its KV cache
    # The math scorer changes audit outcomes: a changed evaluator.
    other = make_domain(small_config(tmp_path, env={"scorer": "math_verify"}))
    assert what_changed(base, evaluator_identity(other, other.tasks("heldout")[:20], cfg.eval)) == [
        "settings:domain changed"
    ]
    # Hidden data beyond the answer (a task's `data`) is in it too.
    tampered = [type(t)(t.id, t.split, t.prompt, t.difficulty, {**t.data, "hidden": 1}) for t in tasks]
    assert what_changed(base, evaluator_identity(domain, tampered, cfg.eval)) == ["data:tasks changed"]
    assert what_changed(base, {**base, "version:torch": "9.9"}) == [f"version:torch {base['version:torch']} -> 9.9"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, math_setup):
    tmp = tmp_path_factory.mktemp("evaluator")
    cfg = small_config(
        tmp,
        loop={
            "segment_steps": 2,
            "trial_steps": 2,
            "candidates": 1,
            "max_rounds": 1,
            "skills_dir": str(tmp / "skills"),
        },
    )
    run_loop(cfg, Console(file=io.StringIO()))
    return cfg, tmp / "runs" / "t"


def test_a_resumed_run_stops_when_the_evaluator_changed_and_says_what(finished_run, monkeypatch):
    cfg, run_dir = finished_run
    ledger = Ledger(run_dir / "ledger.sqlite")
    before = ledger.rows("SELECT key, value FROM meta ORDER BY key")
    ledger.close()
    real = evaluation.metadata.version
    monkeypatch.setattr(evaluation.metadata, "version", lambda pkg: "9.9.9" if pkg == "torch" else real(pkg))
    with pytest.raises(EvaluatorChanged, match=r"version:torch .* -> 9\.9\.9") as e:
        run_loop(cfg, Console(file=io.StringIO()), resume=True)
    assert "--accept-evaluator-change" in str(e.value)
    ledger = Ledger(run_dir / "ledger.sqlite")
    assert ledger.rows("SELECT key, value FROM meta ORDER BY key") == before  # nothing written
    ledger.close()
    # Told to, it goes on under the new evaluator and records what it accepted.
    ctx = open_run(cfg, resume=True, accept_evaluator_change=True)
    accepted = [r for r in ctx.ledger.rows("SELECT key, value FROM meta") if r["key"].startswith("evaluator_accepted")]
    assert accepted and "version:torch" in accepted[0]["value"]
    ctx.ledger.close()


def test_outcomes_from_another_evaluator_are_refused_at_the_gate_and_the_final_read(finished_run):
    cfg, run_dir = finished_run
    ctx = open_run(cfg, resume=True, accept_evaluator_change=True)
    try:
        import json

        gate_hash = identity_hash(json.loads(ctx.ledger.get_meta("evaluator"))["gate"])
        expect_evaluator(ctx, "gate", gate_hash, "an arm")  # the run's own: fine
        with pytest.raises(EvaluatorChanged, match="not the run's"):
            expect_evaluator(ctx, "gate", "e-000000000000", "arm r01-c1")
        with pytest.raises(EvaluatorChanged, match="final"):
            expect_evaluator(ctx, "final", gate_hash, "the final read")  # the gate tasks' hash is not the final's
    finally:
        ctx.ledger.close()
