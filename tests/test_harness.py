"""The harness as an evolvable value: versions, the knob registry, single-factor interventions."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import evotrainer
from evotrainer.harness.filters import MIN_STD, std_cuts, trainable
from evotrainer.harness.harness import Harness
from evotrainer.harness.interventions import Intervention, InterventionError, diff, load_intervention
from evotrainer.harness.knobs import MAPPINGS, knob, registry

HYP = {"finding": "truncation", "signal": "completions/clipped_ratio", "direction": "down"}


def test_registry_covers_every_field_with_meaning_and_mappings():
    ks = {k.path: k for k in registry()}
    flat = {p for p, _, _ in diff(Harness(), Harness(reward_weights={"correct": 2.0, "format": 0.1}))}
    assert "reward_weights.*" in ks and flat == {"reward_weights.correct"}
    for section in ("sampling", "loss", "shaping", "filters", "curriculum", "optimizer", "multi_turn"):
        fields = type(getattr(Harness(), section)).model_fields
        for f in fields:
            k = ks[f"{section}.{f}"]
            assert k.meaning, f"{k.path} has no docstring"
            assert k.path in MAPPINGS, f"{k.path} has no TRL/verl/OpenRLHF row"
    assert ks["sampling.num_generations"].trl == "num_generations"
    assert ks["sampling.num_generations"].verl == "actor_rollout_ref.rollout.n"
    assert ks["loss.loss_type"].choices == ("grpo", "dr_grpo", "dapo")
    assert ks["sampling.temperature"].low == 0.0 and ks["sampling.temperature"].high == 5.0
    assert ks["reward_weights.*"].replayable and not ks["loss.beta"].replayable
    assert knob("reward_weights.format").path == "reward_weights.*"


# One strategy per intervention kind, over values the validators accept.
interventions = st.one_of(
    st.builds(lambda v: ("set_knob", "sampling.max_completion_length", v), st.integers(17, 4096)),
    st.builds(lambda v: ("set_knob", "sampling.temperature", v), st.floats(0.05, 5.0).filter(lambda x: x != 1.0)),
    st.builds(lambda v: ("set_knob", "optimizer.learning_rate", v), st.floats(0.0, 1.0).filter(lambda x: x != 3e-4)),
    st.builds(lambda v: ("set_knob", "loss.beta", v), st.floats(0.001, 10.0)),
    st.builds(lambda v: ("set_knob", "shaping.overlong_buffer_len", v), st.integers(1, 15)),
    st.builds(
        lambda v: ("set_reward_weight", "reward_weights.format", v), st.floats(-5, 5).filter(lambda x: x != 0.1)
    ),
    st.builds(lambda v: ("add_reward_term", "reward_weights.brevity", v), st.floats(0.01, 5)),
    st.just(("remove_reward_term", "reward_weights.format", None)),
    st.sampled_from(
        [
            ("replace_reward_term", "reward_weights.correct", "tests_restored"),
            ("replace_reward_term", "reward_weights.format", "brevity"),
        ]
    ),
    st.builds(lambda v: ("add_filter", "filters.zero_std_threshold", v), st.floats(0.0, 1.0)),
    st.builds(
        lambda v: ("add_filter", "filters.mask_terminations", v),
        st.lists(st.sampled_from(["length", "timeout", "error", "tool_error"]), min_size=1, unique=True),
    ),
    st.just(("add_filter", "loss.mask_truncated_completions", True)),
    st.sampled_from(
        [
            ("swap_estimator", "loss.advantage_estimator", "rloo"),
            ("swap_estimator", "loss.scale_rewards", "none"),
            ("swap_estimator", "loss.scale_rewards", "batch"),
            ("swap_loss_type", "loss.loss_type", "grpo"),
            ("swap_loss_type", "loss.loss_type", "dr_grpo"),
            ("set_knob", "multi_turn.tool_error", "mask"),
        ]
    ),
    st.builds(
        lambda v: ("set_curriculum", "curriculum.levels", v), st.lists(st.integers(0, 5), min_size=1, unique=True)
    ),
    st.builds(lambda v: ("set_curriculum", "curriculum.easy_threshold", v), st.floats(0.0, 1.0)),
)
parents = st.builds(
    lambda lr, g, w, p: Harness(
        optimizer={"learning_rate": lr},
        sampling={"num_generations": g},
        reward_weights={"correct": 1.0, "format": w},
        parent=p,
    ),
    st.sampled_from([3e-4, 1e-5]),
    st.integers(1, 16),
    st.sampled_from([0.1, 0.5]),
    st.sampled_from([None, "h-000000000000"]),
)


@settings(max_examples=300, deadline=None)
@given(parents, interventions)
def test_apply_then_revert_round_trips_the_hash(parent, spec):
    kind, target, value = spec
    iv = Intervention(kind=kind, target=target, value=value, hypothesis=HYP).bind(parent)
    try:
        child = iv.apply(parent)
    except InterventionError as e:
        assert "changes nothing" in str(e)  # the parent may already hold the drawn value
        return
    assert child.parent == parent.version and child.version != parent.version
    changed = [path for path, _, _ in diff(parent, child)]
    if kind == "replace_reward_term":  # one factor: the weight moves from one grader to the other
        assert changed == sorted([target, f"reward_weights.{value}"])
    else:
        assert len(changed) == 1  # exactly one factor
    back = iv.revert(child)
    assert back.version == parent.version and back.canonical() == parent.canonical() and back == parent
    # The bound intervention serializes (ledgers store it) and still reverts after a round trip.
    again = Intervention.model_validate(json.loads(iv.model_dump_json()))
    assert again.revert(child).version == parent.version


def test_multi_factor_and_bad_patches_are_refused(tmp_path):
    h = Harness()
    with pytest.raises(InterventionError, match="exactly one knob.*loss.beta, loss.epsilon"):
        Intervention(kind="set_knob", target="loss", value={"beta": 0.1, "epsilon": 0.1}, hypothesis=HYP).apply(h)
    with pytest.raises(InterventionError, match="sampling.temperature"):
        Intervention(kind="set_knob", target="sampling.temperature", value=-1.0, hypothesis=HYP).apply(h)
    with pytest.raises(InterventionError, match="unknown knob"):
        Intervention(kind="set_knob", target="sampling.temprature", value=0.5, hypothesis=HYP).apply(h)
    with pytest.raises(InterventionError, match="swap_loss_type cannot target"):
        Intervention(kind="swap_loss_type", target="loss.beta", value=0.5, hypothesis=HYP).apply(h)
    with pytest.raises(InterventionError, match="no such reward term"):
        Intervention(kind="remove_reward_term", target="reward_weights.brevity", hypothesis=HYP).apply(h)
    with pytest.raises(InterventionError, match="already pays 'format'"):
        Intervention(
            kind="replace_reward_term", target="reward_weights.correct", value="format", hypothesis=HYP
        ).apply(h)
    with pytest.raises(InterventionError, match="needs the new term's name"):
        Intervention(kind="replace_reward_term", target="reward_weights.correct", value=1.0, hypothesis=HYP).apply(h)
    two = tmp_path / "two.yaml"
    one = {"kind": "set_knob", "target": "loss.beta", "value": 0.1, "hypothesis": HYP}
    two.write_text(yaml.safe_dump([one, {**one, "target": "loss.epsilon"}]))
    with pytest.raises(InterventionError, match="holds 2 interventions"):
        load_intervention(two)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**one, "kind": "tweak"}))
    with pytest.raises(InterventionError, match="kind"):
        load_intervention(bad)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True)


def test_cli_knobs_and_harness_diff(tmp_path):
    out = run_cli("knobs", "--json")
    assert out.returncode == 0
    rows = json.loads(out.stdout)
    assert {r["path"] for r in rows} == {k.path for k in registry()}
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(Harness().model_dump(mode="json")))
    b.write_text(
        yaml.safe_dump({"harness": Harness(loss={"beta": 0.04}).model_dump(mode="json")})
    )  # a run config works too
    out = run_cli("harness", "diff", str(a), str(b))
    assert out.returncode == 0 and "loss.beta" in out.stdout and "0.04" in out.stdout
    assert "sampling" not in out.stdout
    as_json = run_cli("harness", "diff", str(a), str(b), "--json")
    assert json.loads(as_json.stdout) == [{"knob": "loss.beta", "a": Harness().loss.beta, "b": 0.04}]
    assert json.loads(run_cli("harness", "diff", str(a), str(a), "--json").stdout) == []
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"evotrainer {evotrainer.__version__}"
    show = run_cli("harness", "show", str(b))
    assert show.returncode == 0 and Harness(loss={"beta": 0.04}).version in show.stdout
    bad = run_cli("harness", "show", str(tmp_path / "missing.yaml"))
    assert bad.returncode == 2 and "missing.yaml" in bad.stderr


def test_std_filter_keeps_the_most_spread_groups_with_an_ema_threshold():
    h = Harness(filters={"std_keep_ratio": 0.9, "std_ema_decay": 0.5})
    group = np.repeat(np.arange(10), 2)
    # Step 0: group g has std g/10 (group 0 none); step 1: every std doubled.
    std0 = np.repeat(np.arange(10) / 10, 2)
    cut0, ema0 = std_cuts(h, std0, group, np.zeros(20, np.int64))
    q0 = float(np.quantile(np.arange(10) / 10, 0.1))
    assert ema0 == pytest.approx(q0, abs=1e-12) and np.allclose(cut0, max(q0, MIN_STD))
    keep0 = trainable(h, np.array(["stop"] * 20), std0, cut0)
    assert keep0.reshape(10, 2).all(axis=1).tolist() == [False] + [True] * 9  # the lowest tenth leaves the loss
    cut1, ema1 = std_cuts(h, 2 * std0, group, np.ones(20, np.int64), ema0)
    assert ema1 == pytest.approx(0.5 * q0 + 0.5 * 2 * q0, abs=1e-12)  # the EMA lags the new quantile
    # Both steps at once (as replay reads a window) give the same thresholds as one step after the other.
    both, last = std_cuts(
        h, np.concatenate([std0, 2 * std0]), np.concatenate([group, group + 10]), np.repeat([0, 1], 20)
    )
    assert np.allclose(both, np.concatenate([cut0, cut1])) and last == pytest.approx(ema1, abs=1e-12)
    # Groups without spread never train, whatever the quantile says.
    flat, _ = std_cuts(h, np.zeros(20), group, np.zeros(20, np.int64))
    assert not trainable(h, np.array(["stop"] * 20), np.zeros(20), flat).any()
    assert std_cuts(Harness(), std0, group, np.zeros(20, np.int64)) == (None, None)


def test_new_filter_knobs_keep_older_versions_and_export_with_reasons():
    assert Harness(filters={"std_ema_decay": 0.95}).version == Harness().version  # at defaults: the old hash
    assert Harness(filters={"std_keep_ratio": 0.9}).version != Harness().version
    assert not knob("filters.std_keep_ratio").honours("trl", 0.9) and knob("filters.std_keep_ratio").honours(
        "verl", None
    )
