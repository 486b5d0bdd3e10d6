"""Property: any one mistake in a valid config (a field of the wrong type, an unknown key at any level, a
number outside the range its model declares) stops `evotrainer run` with exit code 2 and a message that
names the field: no traceback, and no run directory. Mutations are derived from the pydantic models."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from reasoning_gym.factory import DATASETS

from evotrainer.cli.main import main
from evotrainer.config import RunConfig, domain_config, parse_config
from evotrainer.stages import start

ENVS: dict[str, dict[str, Any]] = {
    "math": {
        "domain": "math",
        "train_size": 200,
        "datasets": [
            {"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
        ],
    },
    "digits": {"domain": "digits", "num_digits": 2, "train_size": 100},
    "code": {"domain": "code", "train_size": 100},
    "swe": {"domain": "swe", "levels": [0], "train_size": 20},
}
# The math dataset's own settings are reasoning-gym's, not ours: a level of its own for unknown keys.
DATASET_CONFIG = ("env", "datasets", 0, "config")
DATASET_FIELDS = {f.name for f in dataclasses.fields(DATASETS["chain_sum"][1])}


def base_config(out: Path, domain: str) -> dict[str, Any]:
    """A valid, small config whose every path stays under `out`."""
    return {
        "run": {"name": "prop", "out_dir": str(out / "runs"), "seed": 0},
        "policy": {
            "kind": "tiny",
            "cache_dir": str(out / "cache"),
            "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "vocab_size": 200, "max_positions": 64},
            "warm_start": {"steps": 1, "batch_size": 4, "demonstrations": 100},
        },
        "env": copy.deepcopy(ENVS[domain]),
        "harness": {"sampling": {"num_generations": 4, "prompts_per_step": 4, "max_completion_length": 8}},
        "train": {"steps": 1},
        "eval": {"heldout_size": 20, "max_new_tokens": 8},
        "loop": {
            "max_rounds": 1,
            "skills_dir": str(out / "skills"),
            "planted": [
                {
                    "kind": "set_knob",
                    "target": "optimizer.learning_rate",
                    "value": 0.001,
                    "hypothesis": {"finding": "plateau", "signal": "heldout/accuracy", "direction": "up"},
                }
            ],
        },
        "gate": {"level": 0.9},
        "budget": {"generated_tokens": 1000},
        "llm": {},
    }


def _core(annotation: Any) -> Any:
    """The annotation without `| None`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _model(annotation: Any) -> type[BaseModel] | None:
    core = _core(annotation)
    return core if isinstance(core, type) and issubclass(core, BaseModel) else None


def schema(domain: str) -> tuple[list[tuple], list[tuple[tuple, FieldInfo]]]:
    """Every model level (a path to a section) and every field (path, FieldInfo) of a config of `domain`."""
    levels: list[tuple] = []
    fields: list[tuple[tuple, FieldInfo]] = []

    def walk(model: type[BaseModel], prefix: tuple, above: tuple = ()) -> None:
        levels.append(prefix)
        above = (*above, model)
        for name, info in model.model_fields.items():
            path = prefix + (name,)
            fields.append((path, info))
            if path == ("env",):
                walk(domain_config(domain), path, above)
            elif typing.get_origin(info.annotation) is list and _model(typing.get_args(info.annotation)[0]):
                walk(_model(typing.get_args(info.annotation)[0]), path + (0,), above)
            elif (sub := _model(info.annotation)) and sub not in above:
                # A model that holds itself (an intervention's `paired`) is walked once: its fields are those above.
                walk(sub, path, above)

    walk(RunConfig, ())
    return levels, fields


SCHEMAS = {d: schema(d) for d in ENVS}
KNOWN_NAMES = {str(p[-1]) for _, fields in SCHEMAS.values() for p, _ in fields} | DATASET_FIELDS


def wrong_values(path: tuple, annotation: Any) -> list[Any]:
    """Values of a type the field cannot take (pydantic coerces "3" to 3, so no numeric strings)."""
    core = _core(annotation)
    origin = typing.get_origin(core)
    if core is Any:  # an intervention's recorded `before`: any value is its type
        return []
    if path == ("env", "domain"):
        return [7, 2.5, True, [1, 2], {"a": 1}]
    if origin in (list, tuple):
        return [{"a": 1}, 7, "text"]
    if origin is Literal:
        return [[1, 2], {"a": 1}, 7]
    if core is bool:
        return [[1, 2], {"a": 1}, "maybe"]
    if core in (int, float):
        return [[1, 2], {"a": 1}, "many"] + ([2.5] if core is int else [])
    if origin is dict or _model(core) or path == ("env",):
        return [[1, 2], 7, "text"]  # a mapping would be the right type
    return [[1, 2], {"a": 1}]  # str, Path


def out_of_range(annotation: Any, metadata: list) -> list[st.SearchStrategy]:
    """Strategies for values just or far outside each bound the field declares (ge, gt, le, lt)."""
    integral = _core(annotation) is int
    step = st.integers(1, 10**6) if integral else st.floats(1e-3, 1e6)
    reach = st.integers(0, 10**6) if integral else st.floats(0, 1e6)  # from the open bound itself
    out = []
    for m in metadata:
        for name, distance, sign in (("ge", step, -1), ("gt", reach, -1), ("le", step, 1), ("lt", reach, 1)):
            if (bound := getattr(m, name, None)) is not None:
                out.append(distance.map(lambda d, b=bound, s=sign: b + s * d))
    return out


@st.composite
def mutations(draw) -> tuple[str, str, tuple, Any]:
    """(domain, kind, path, value): one mistake in the base config of a domain."""
    domain = draw(st.sampled_from(sorted(ENVS)))
    levels, fields = SCHEMAS[domain]
    kind = draw(st.sampled_from(["wrong_type", "unknown_key", "out_of_range"]))
    if kind == "unknown_key":
        level = draw(st.sampled_from(levels + ([DATASET_CONFIG] if domain == "math" else [])))
        key = draw(st.from_regex(r"\A[a-z][a-z0-9_\[\]/]{0,15}\Z").filter(lambda k: k not in KNOWN_NAMES))
        value = draw(st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.lists(st.integers(), max_size=2)))
        return domain, kind, level + (key,), value
    if kind == "wrong_type":
        path, info = draw(st.sampled_from([(p, i) for p, i in fields if wrong_values(p, i.annotation)]))
        return domain, kind, path, draw(st.sampled_from(wrong_values(path, info.annotation)))
    bounded = [(p, i) for p, i in fields if out_of_range(i.annotation, i.metadata)]
    path, info = draw(st.sampled_from(bounded))
    strategy = draw(st.sampled_from(out_of_range(info.annotation, info.metadata)))
    return domain, kind, path, draw(strategy)


def set_path(raw: dict, path: tuple, value: Any) -> None:
    node = raw
    for key in path[:-1]:
        node = node[key] if isinstance(key, int) else node.setdefault(key, {})
    node[path[-1]] = value


def named(path: tuple, err: str) -> bool:
    """The message names the field: as a line of the config's list of invalid fields, or (the settings
    reasoning-gym reads) as the domain names its dataset."""
    if len(path) > len(DATASET_CONFIG) and path[: len(DATASET_CONFIG)] == DATASET_CONFIG:
        return "env.datasets[0]: " in err
    # A single value given for a list is read as a one-element list, so the line names its element (`.0`).
    dotted = re.escape(".".join(str(p) for p in path))
    return re.search(rf"\n  {dotted}(\.\d+)? = ", err) is not None


@pytest.mark.parametrize("domain", sorted(ENVS))
def test_base_configs_are_valid(tmp_path, domain):
    parse_config(base_config(tmp_path, domain))


_examples = itertools.count()


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mutation=mutations())
def test_one_config_mistake_stops_run_before_anything_is_written(tmp_path, monkeypatch, capsys, mutation):
    domain, kind, path, value = mutation
    out = tmp_path / f"example-{next(_examples)}"
    out.mkdir()
    raw = base_config(out, domain)
    set_path(raw, path, value)
    f = out / "c.yaml"
    f.write_text(yaml.safe_dump(raw))

    def accepted(*_args, **_kwargs):
        raise AssertionError(f"{kind} {path}={value!r} was accepted")  # and the run would train

    monkeypatch.setattr(start, "start", accepted)
    monkeypatch.setattr(sys, "argv", ["evotrainer", "run", str(f)])
    monkeypatch.chdir(out)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert "Traceback" not in err
    assert named(path, err), f"{kind} {path}={value!r}: {err}"
    assert sorted(p.name for p in out.iterdir()) == ["c.yaml"]  # no run directory, cache or skills


def _run_cli_in_process(tmp_path, monkeypatch, capsys, raw: dict) -> tuple[int, str]:
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(sys, "argv", ["evotrainer", "run", str(f)])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    except Exception as e:  # a traceback: what the CLI must not show
        code = f"{type(e).__name__}: {e}"
    return code, capsys.readouterr().err


def test_unhashable_env_domain_is_a_config_error(tmp_path, monkeypatch, capsys):
    raw = base_config(tmp_path, "math")
    raw["env"]["domain"] = [1, 2]
    code, err = _run_cli_in_process(tmp_path, monkeypatch, capsys, raw)
    assert code == 2 and "env.domain" in err


def test_markup_in_an_unknown_key_is_printed_verbatim(tmp_path, monkeypatch, capsys):
    raw = base_config(tmp_path, "math")
    raw["train"]["x[/y]"] = 1
    code, err = _run_cli_in_process(tmp_path, monkeypatch, capsys, raw)
    assert code == 2 and "train.x[/y]" in err
