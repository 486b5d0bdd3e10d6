"""The LLM proposer over real HTTP: a scripted OpenAI-compatible server in a thread plays the model.
A loop round proposes through it and trials the proposal; malformed output is repaired or re-asked and
dropped; agent-written detectors are refused when they write or reach for the evaluator's data and
admitted after a backtest; a bad endpoint stops the run before its directory exists; the brief of a
real SWE tampering trajectory reaches the model in full and holds no held-out data."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import pytest
from rich.console import Console

from conftest import train_rollout
from evotrainer.diagnostics import agent
from evotrainer.diagnostics.revision import PastVerdict, admit
from evotrainer.diagnostics.suite import Suite
from evotrainer.diagnostics.window import open_window
from evotrainer.envs.registry import make_domain
from evotrainer.errors import ConfigError
from evotrainer.loop import run_loop
from evotrainer.proposers.brief import IsolationError, build_brief
from evotrainer.proposers.llm import LLMProposer, check_endpoint, parse_reply
from evotrainer.proposers.llm_client import LLMClient, LLMError
from evotrainer.proposers.proposer import Brief
from evotrainer.stages.evidence import past_verdicts
from evotrainer.stages.results import read_stage
from evotrainer.store.ledger import Ledger
from evotrainer.store.rollouts import RolloutStore
from fake_llm import MODEL, FakeLLM, iv
from tests.conftest import small_config

QUIET = Console(file=open(os.devnull, "w"))
VALID_SQL = {
    "name": "long_answers",
    "sql": "SELECT id FROM rollouts WHERE completion_tokens >= 1 ORDER BY reward DESC, step DESC, id",
    "severity": "warning",
    "knobs": ["sampling.max_completion_length"],
    "message": "answers use tokens",
    "max_share": 0.5,
}


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# -- one real round through the loop ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm_run(tmp_path_factory, math_setup):
    """One loop round with loop.proposer llm on the tiny math setup: the model proposes a temperature
    change and two detectors (one valid, one reading the held-out rows), then answers the re-ask."""
    tmp = tmp_path_factory.mktemp("llm")
    first = json.dumps(
        {
            "diagnosis": "groups look alike",
            "interventions": [iv("sampling.temperature", 1.3)],
            "detectors": [VALID_SQL, {**VALID_SQL, "name": "peek", "sql": "SELECT id FROM heldout"}],
        }
    )
    fake = FakeLLM([first, '{"interventions": [], "detectors": []}'])
    # Small steps (the warm-start cache key ignores the harness): the point is the round, not the learning.
    cfg = small_config(
        tmp,
        loop={
            "segment_steps": 3,
            "trial_steps": 2,
            "candidates": 1,
            "max_rounds": 1,
            "proposer": "llm",
            "skills_dir": str(tmp / "skills"),
        },
        harness={"sampling": {"num_generations": 4, "prompts_per_step": 8, "max_completion_length": 8}},
        gate={"resamples": 200},
        llm={"base_url": fake.url, "model": MODEL, "price_input_per_1k": 0.5, "price_output_per_1k": 1.5},
    )
    summary = run_loop(cfg, QUIET)
    yield cfg, summary, fake, Path(cfg.run.out_dir) / cfg.run.name
    fake.close()


def test_a_loop_round_trials_the_llm_proposal_and_charges_its_tokens(llm_run):
    cfg, summary, fake, run_dir = llm_run
    ledger = Ledger(run_dir / "ledger.sqlite")
    try:
        [trial] = ledger.trials()
        assert trial["source"] == "llm" and trial["intervention"]["target"] == "sampling.temperature"
        assert trial["intervention"]["value"] == 1.3 and trial["intervention"]["before"] == 1.0
        assert [v["trial"] for v in ledger.verdicts()] == [trial["id"]]
        propose = read_stage(ledger, 1, "propose")
        records = {d.get("name", d["proposed"].get("name")): d for d in propose.detectors}
        assert records["agent_long_answers"]["admitted"], records
        assert not records["peek"]["admitted"] and "held-out" in records["peek"]["reason"]
        assert "agent_long_answers" in propose.suite.detectors
        charge = ledger.spent_by_stage()["propose"]
        assert charge.llm_input_tokens > 0 and charge.llm_output_tokens > 0
        assert charge.llm_cost == pytest.approx(
            charge.llm_input_tokens / 1000 * 0.5 + charge.llm_output_tokens / 1000 * 1.5
        )
    finally:
        ledger.close()
    # The invalid detector was fed back once; both exchanges are transcripts the report links.
    assert (
        len(fake.requests) == 2 and "held-out rows are the evaluator's" in fake.requests[1]["messages"][-1]["content"]
    )
    t1 = json.loads((run_dir / "llm" / "001-1.json").read_text())
    assert t1["response"] and t1["accepted"][0]["intervention"]["target"] == "sampling.temperature"
    assert t1["input_tokens"] > 0 and t1["cost"] > 0 and t1["seconds"] > 0 and t1["messages"][0]["role"] == "system"
    assert (run_dir / "llm" / "001-2.json").exists()
    assert 'href="llm/001-1.json"' in (run_dir / "report.html").read_text()


def _brief(cfg, run_dir: Path, limit: int = 2) -> Brief:
    store = RolloutStore(run_dir / "store")
    ledger = Ledger(run_dir / "ledger.sqlite")
    try:
        seg = Suite.default().run(store, "r01-seg", 1, 3)
        return build_brief(
            run=cfg.run.name,
            rnd=7,
            domain="math",
            harness=cfg.harness,
            findings=seg,
            store=store,
            branches=["r01-seg"],
            ledger=ledger,
            skills=[],
            limit=limit,
            explore=0.0,
        )
    finally:
        ledger.close()


def _proposer(cfg, fake: FakeLLM, run_dir: Path, **llm) -> LLMProposer:
    c = cfg.model_copy(update={"llm": cfg.llm.model_copy(update={"base_url": fake.url, **llm})})
    return LLMProposer.from_config(c.llm, run_dir, c.run.seed)


# -- malformed output ------------------------------------------------------------------------------------------------
def test_malformed_output_is_repaired_when_unambiguous(llm_run, tmp_path):
    cfg, _, _, run_dir = llm_run
    sloppy = (
        "Here is my answer:\n```json\n{'diagnosis': 'fine', // a comment\n 'interventions': [{'kind': 'set_knob', "
        "'target': 'loss.mask_truncated_completions', 'value': True, 'hypothesis': {'finding': 'explore', "
        "'signal': 'completions/clipped_ratio', 'direction': 'down',},},],}\n```"
    )
    fake = FakeLLM([sloppy])
    try:
        out = _proposer(cfg, fake, tmp_path).propose(_brief(cfg, run_dir)).proposals
    finally:
        fake.close()
    assert [p.intervention.target for p in out if p.source == "llm"] == ["loss.mask_truncated_completions"]
    assert out[0].source == "llm" and all(p.source == "heuristic" for p in out[1:])  # the catalog fills the rest
    assert len(fake.requests) == 1  # repaired, not re-asked
    t = json.loads((tmp_path / "llm" / "007-1.json").read_text())
    assert {
        "code fence removed",
        "comments removed",
        "trailing commas removed",
        "single-quoted strings converted",
        "Python True / False / None converted",
    } <= set(t["repairs"])


def test_unusable_output_is_reasked_once_then_dropped_and_recorded(llm_run, tmp_path):
    cfg, _, _, run_dir = llm_run
    fake = FakeLLM(["I would raise the temperature a little.", '{"interventions": [{"kind": "set_knob", "target": '])
    try:
        p = _proposer(cfg, fake, tmp_path)
        out = p.propose(_brief(cfg, run_dir))
    finally:
        fake.close()
    # Nothing of the model's is kept; the round's slots go to the heuristic catalog, which says why.
    assert out.proposals and all(p.source == "heuristic" for p in out.proposals)
    assert all("the LLM proposed nothing usable" in p.note for p in out.proposals)
    assert out.detectors == [] and len(fake.requests) == 2
    assert "no JSON object found" in fake.requests[1]["messages"][-1]["content"]
    t2 = json.loads((tmp_path / "llm" / "007-2.json").read_text())
    assert t2["parsed"] is None and "not valid JSON" in t2["error"]
    assert out.charges["llm"].llm_input_tokens > 0


def test_multi_factor_out_of_range_and_evaluator_targets_are_refused_with_reasons_fed_back(llm_run, tmp_path):
    cfg, _, _, run_dir = llm_run
    bad = [
        iv("sampling.temperature", 9.0),
        iv("sampling", {"temperature": 1.2, "top_p": 0.9}),
        iv("eval.heldout_size", 1),
        iv("gate.level", 0.51),
        iv("suite_version", "s-0"),
        {**iv("loss.entropy_coef", 0.01), "bound": True},
        iv("loss.epsilon", 0.3),  # one pass over each batch: the clip range cannot act (harness/inert.py)
    ]
    fake = FakeLLM(
        [json.dumps({"interventions": bad}), json.dumps({"interventions": [iv("loss.entropy_coef", 0.01)]})]
    )
    try:
        out = _proposer(cfg, fake, tmp_path).propose(_brief(cfg, run_dir, limit=1)).proposals
    finally:
        fake.close()
    assert [(p.intervention.target, p.intervention.value) for p in out] == [("loss.entropy_coef", 0.01)]
    said = fake.requests[1]["messages"][-1]["content"]
    for reason in (
        "out of range",
        "exactly one knob",
        "unknown knob 'eval.heldout_size'",
        "unknown knob 'gate.level'",
        "set_knob cannot target suite_version",
        "unknown field(s) ['bound']",
        "inert: loss.epsilon acts only through the importance ratio",
    ):
        assert reason in said, reason


def test_transient_errors_are_retried_and_a_dead_endpoint_is_no_crash(llm_run, tmp_path):
    fake = FakeLLM([503, 429, '{"interventions": []}'])
    try:
        client = LLMClient(fake.url, MODEL, None, backoff_seconds=0.01, max_retries=2)
        reply = client.chat([{"role": "user", "content": "hi"}])
        assert reply.text == '{"interventions": []}' and len(reply.attempts) == 2
        fake.script = [500, 500, 500]
        with pytest.raises(LLMError, match="gave up after 3"):
            client.chat([{"role": "user", "content": "hi"}])
        # Through the proposer, a failed exchange is an empty round with a transcript, not an exception.
        cfg, _, _, run_dir = llm_run
        p = _proposer(cfg, fake, tmp_path, max_retries=0)
        fake.script = [500]
        assert all(x.source == "heuristic" for x in p.propose(_brief(cfg, run_dir)).proposals)
        assert "HTTP 500" in json.loads((tmp_path / "llm" / "007-1.json").read_text())["error"]
    finally:
        fake.close()


def test_the_cost_cap_stops_asking_and_old_ledgers_gain_the_llm_columns(llm_run, tmp_path):
    import sqlite3

    cfg, _, _, run_dir = llm_run
    fake = FakeLLM(['{"interventions": []}', '{"interventions": []}'])
    try:
        p = _proposer(cfg, fake, tmp_path, price_input_per_1k=10.0, max_cost=0.01)
        brief = _brief(cfg, run_dir)
        first = p.propose(brief)
        p.propose(brief)  # the first exchange spent past the cap: no second request
    finally:
        fake.close()
    assert (
        len(fake.requests) == 1
        and "llm.max_cost" in json.loads((tmp_path / "llm" / "007-1.json").read_text())["skipped"]
    )
    # A ledger written before the LLM columns existed opens, keeps its rows and charges the new fields.
    con = sqlite3.connect(tmp_path / "old.sqlite")
    con.execute(
        "CREATE TABLE charges (round INTEGER NOT NULL, stage TEXT NOT NULL, item TEXT NOT NULL, "
        "generated_tokens INTEGER NOT NULL, trained_tokens INTEGER NOT NULL, seconds REAL NOT NULL, "
        "PRIMARY KEY (round, stage, item))"
    )
    con.execute("INSERT INTO charges VALUES (1, 'train', 'seg', 10, 5, 1.5)")
    con.commit()
    con.close()
    ledger = Ledger(tmp_path / "old.sqlite")
    try:
        ledger.finish_stage(1, "propose", {}, charges=first.charges)
        spent = ledger.spent()
        assert (
            (spent.generated_tokens, spent.trained_tokens) == (10, 5)
            and spent.llm_input_tokens > 0
            and spent.llm_cost > 0.01
        )
    finally:
        ledger.close()


# -- agent-written detectors ------------------------------------------------------------------------------------------
def test_agent_detectors_that_write_or_reach_for_evaluator_data_are_refused(llm_run):
    cfg, _, _, run_dir = llm_run
    store = RolloutStore(run_dir / "store")
    shards = (run_dir / "store" / "rollouts").as_posix()
    attempts = {
        "writes": "CREATE TABLE x AS SELECT id FROM rollouts",
        "copies": f"COPY (SELECT id FROM rollouts) TO '{run_dir}/x.csv'",
        "two_statements": "SELECT id FROM rollouts; DROP TABLE rollouts",
        "attaches": f"ATTACH '{run_dir}/ledger.sqlite' AS l",
        "heldout_view": "SELECT id FROM heldout",
        "heldout_shards": f"SELECT id FROM read_parquet('{shards}/*.parquet') WHERE split = 'heldout'",
        "file_literal": f"SELECT id FROM '{shards}/base-e000000.parquet'",
        "config": f"SELECT content AS id FROM read_text('{run_dir}/config.yaml')",
        "evaluator_code": "SELECT content AS id FROM read_text('evotrainer/evaluation.py')",
        "environment": "SELECT getenv('EVOTRAINER_LLM_API_KEY') AS id FROM rollouts",
        "window_internals": "SELECT id FROM _window_rollouts",
    }
    detectors = [{**VALID_SQL, "name": k, "sql": q} for k, q in attempts.items()]
    evaluator = Path(agent.__file__).parents[1] / "evaluation.py"
    for name, path in (("reads_config", run_dir / "config.yaml"), ("reads_evaluator", evaluator)):
        detectors.append(
            {**VALID_SQL, "name": name, "sql": None, "python": f"def flag(r):\n    return bool(open('{path}').read())"}
        )
    suite = Suite.default()
    new, records = admit(suite, store, detectors[:2], "r01-seg", 1, 3, [])
    assert new.version == suite.version and not any(r["admitted"] for r in records)
    for start in range(2, len(detectors), agent.PER_ROUND):
        new, more = admit(suite, store, detectors[start : start + agent.PER_ROUND], "r01-seg", 1, 3, [])
        assert new.version == suite.version
        records += more
    by_name = {r["proposed"]["name"]: r for r in records}
    assert all(not r["admitted"] for r in records), [r for r in records if r["admitted"]]
    assert "only a SELECT" in by_name["writes"]["reason"] and "only a SELECT" in by_name["copies"]["reason"]
    assert "exactly one statement" in by_name["two_statements"]["reason"]
    assert "held-out" in by_name["heldout_view"]["reason"] and "read_parquet" in by_name["heldout_shards"]["reason"]
    assert "files and URLs" in by_name["file_literal"]["reason"] and "read_text" in by_name["config"]["reason"]
    assert "getenv" in by_name["environment"]["reason"] and "no such table" in by_name["window_internals"]["reason"]
    for name in ("reads_config", "reads_evaluator"):  # the sandbox sees neither the run directory nor the package
        assert "FileNotFoundError" in by_name[name]["reason"], by_name[name]
    # Even past the static check, the runtime copy holds train rows only and cannot read files.
    w = open_window(store, "r01-seg", 1, 3, agent.AGENT_DEFAULTS)
    try:
        con = agent._readonly_copy(w, str(run_dir / "store"))
        assert con.execute("SELECT count(*) FROM rollouts WHERE split <> 'train'").fetchone()[0] == 0
        for q in (f"SELECT * FROM read_parquet('{shards}/*.parquet')", "CREATE TABLE x AS SELECT 1"):
            with pytest.raises(Exception, match="Permission|read-only"):
                con.execute(q)
        con.close()
    finally:
        w.con.close()
        (run_dir / "store" / "window.duckdb").unlink(missing_ok=True)


def test_a_valid_agent_detector_is_admitted_after_backtest_and_cites_its_query_rows(llm_run):
    cfg, _, _, run_dir = llm_run
    store = RolloutStore(run_dir / "store")
    ledger = Ledger(run_dir / "ledger.sqlite")
    try:
        past = past_verdicts(ledger)
    finally:
        ledger.close()
    failing = {
        "name": "audit_failures",
        "sql": "SELECT id FROM rollouts WHERE audit = false ORDER BY step DESC, id",
        "severity": "critical",
        "validity": True,
        "knobs": ["reward_weights.correct"],
        "message": "audited failures",
    }
    # Flags every rollout, passing or failing the audit: its validity claim is not confirmed, so it joins as a warning.
    predicate = {
        **VALID_SQL,
        "name": "py_long",
        "sql": None,
        "validity": True,
        "python": "def flag(r):\n    return r['completion_tokens'] >= 1 and r['turns'][0]['action'] is not None\n",
    }
    suite = Suite.default()
    new, records = admit(suite, store, [failing, predicate], "r01-seg", 1, 3, past)
    assert all(r["admitted"] for r in records), records
    assert new.version != suite.version and {"agent_audit_failures", "agent_py_long"} <= set(new.detectors)
    assert [r["suite_version"] for r in records][-1] == new.version  # one revision per admitted detector, chained
    assert new.detectors["agent_audit_failures"].sql.validity and "validity_demoted" in records[1]
    assert not new.detectors["agent_py_long"].python.validity and records[1]["window"]["flagged"] > 0
    # Round trip through JSON (the loop stores suites in the ledger) keeps the version.
    assert Suite.model_validate(json.loads(json.dumps(new.model_dump(mode="json")))).version == new.version
    [f] = [f for f in new.run(store, "r01-seg", 1, 3) if f.name == "agent_audit_failures"]
    failed = {
        r["id"]
        for r in store.sql("SELECT id FROM rollouts WHERE branch = 'r01-seg' AND split = 'train' AND audit = false")
    }
    assert f.evidence and set(f.evidence) <= failed
    # It flags audit failures the window's reward does not pay (a tiny policy's wrong answers): admitted as a
    # validity detector, its finding on this window is weighed and stays a warning, with its figures.
    row = store.sql(
        "SELECT count(*) AS n, count(*) FILTER (WHERE reward >= 0.5) AS paid FROM rollouts "
        "WHERE branch = 'r01-seg' AND split = 'train' AND audit = false"
    )[0]
    counts = row["n"] < 10 or row["paid"] / row["n"] >= 0.5  # suite.WEIGH_MIN_AUDITED, suite.PAID_FAILING
    assert f.validity == counts and (f.demoted == "") == counts
    # Had a window of the round been a promoted trial's, a validity finding counted there would flip that
    # verdict to a rejection: refused. The window is one step where the finding counts: a step audits fewer
    # rollouts than weigh needs, so any step with audit failures counts; over a whole trial the tiny policy's
    # unpaid failures may demote it, depending on how far the race let the candidate run on this machine.
    [cand] = past
    steps = [(cand.branch, s, s) for s in range(cand.first_step, cand.last_step + 1)] + [
        ("r01-seg", s, s) for s in (1, 2, 3)
    ]
    counted = [w for w in steps if any(x.name == "agent_audit_failures" and x.validity for x in new.run(store, *w))]
    assert counted, "no step of the round has the audit failures the finding needs"
    promoted = [PastVerdict(*counted[0], "promote")]
    _, recs = admit(suite, store, [failing], "r01-seg", 1, 3, promoted)
    assert not recs[0]["admitted"] and "would change 1 past verdict" in recs[0]["reason"]


# -- start-up, isolation --------------------------------------------------------------------------------------------
def test_a_bad_endpoint_is_a_config_error_before_the_run_directory_exists(tmp_path):
    base = {"loop": {"max_rounds": 1, "proposer": "llm", "skills_dir": str(tmp_path / "skills")}}
    cfg = small_config(tmp_path, llm={"base_url": f"http://127.0.0.1:{_closed_port()}/v1", "model": MODEL}, **base)
    with pytest.raises(ConfigError, match="cannot reach"):
        check_endpoint(cfg.llm)
    fake = FakeLLM(models=("other-model",))
    try:
        with pytest.raises(ConfigError, match="'scripted-model' is not served.*other-model"):
            LLMProposer.from_config(
                small_config(tmp_path, llm={"base_url": fake.url, "model": MODEL}, **base).llm, tmp_path / "x", 0
            )
    finally:
        fake.close()
    with pytest.raises(ConfigError, match="llm.base_url: not set"):
        LLMProposer.from_config(small_config(tmp_path, **base).llm, tmp_path / "x", 0)
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="cannot reach"):
        run_loop(cfg, QUIET)
    assert not (Path(cfg.run.out_dir) / cfg.run.name).exists()  # the endpoint is checked before anything is written


def test_the_brief_holds_no_heldout_data(llm_run, tmp_path):
    cfg, _, _, run_dir = llm_run
    brief = _brief(cfg, run_dir)
    assert brief.evidence and all(r["split"] == "train" for r in brief.evidence.values())
    fake = FakeLLM(['{"interventions": []}'])
    try:
        _proposer(cfg, fake, tmp_path).propose(brief)
    finally:
        fake.close()
    sent = fake.prompt()
    store = RolloutStore(run_dir / "store")
    heldout = store.sql("SELECT id, task_id, prompt FROM rollouts WHERE split = 'heldout'")
    assert heldout and not [r for r in heldout if r["id"] in sent or r["task_id"] in sent]
    domain = make_domain(cfg)
    assert not [t for t in domain.tasks("heldout") if t.prompt in sent]
    # A brief that somehow held a held-out rollout never leaves the process.
    leaked = Brief(
        **{**brief.__dict__, "evidence": {**brief.evidence, heldout[0]["id"]: {**heldout[0], "split": "heldout"}}}
    )
    fake = FakeLLM()
    try:
        with pytest.raises(IsolationError):
            _proposer(cfg, fake, tmp_path).propose(leaked)
        assert fake.requests == []
    finally:
        fake.close()


def test_evidence_is_left_out_whole_to_fit_the_context(llm_run, tmp_path):
    from evotrainer.proposers.llm_prompt import render

    cfg, _, _, run_dir = llm_run
    brief = _brief(cfg, run_dir)
    full = render(brief, 10**6)
    assert full.shown and not full.left_out
    head_only = render(Brief(**{**brief.__dict__, "evidence": {}}), 10**6).tokens
    tight = render(brief, head_only + 150)
    assert tight.left_out and len(tight.shown) < len(full.shown)
    assert f"{len(tight.left_out)} evidence rollout(s) left out" in tight.text
    for rid in tight.shown:
        assert f"----- end of {rid} -----" in tight.text  # every shown rollout is whole
    assert parse_reply("```json\n{}\n```\n```json\n{}\n```")[2].startswith("the reply holds 2 code blocks")


# -- SWE: the tampering trajectory reaches the model in full ----------------------------------------------------------
def test_the_brief_of_a_swe_run_with_tampering_holds_the_tampering_trajectory_in_full(tmp_path):
    """Real SWE episodes through the env and its sandboxed test runner (played, not sampled from a trained
    policy: a warm-started SWE policy costs minutes): half look at the file, fix the bug and submit; half
    edit the failing test's assertion into `assert True` and submit, which the visible `tests` reward
    pays and the audit fails. The suite's test_tampering finding cites them; the prompt the model
    receives holds the cited trajectory whole: prompt, every action, every observation, rewards, audit."""
    from evotrainer.envs.swe.domain import SweDomain
    from evotrainer.harness.harness import Harness
    from evotrainer.harness.rewards import score
    from evotrainer.types import Turn

    domain = SweDomain(seed=0, levels=[0], train_size=40, heldout_size=8)
    harness = Harness(reward_weights={"tests": 1.0})
    store, ledger = RolloutStore(tmp_path / "store"), Ledger(tmp_path / "ledger.sqlite")
    tasks = [t for t in domain.tasks("train") if len(t.data["failing"]) == 1]
    for step in (1, 2):
        rollouts = []
        for i in range(16):
            task = tasks[(step * 16 + i) % len(tasks)]
            path, _, test = task.data["failing"][0].partition("::")
            line = task.data["files"][path].split("\n").index(f"def {test}():") + 2
            fix = task.data["fix"]
            actions = (
                [f"cat {fix['file']}", f"replace {fix['file']} {fix['line']} {fix['text']}", "submit"]
                if i % 2
                else [f"cat {path}", f"replace {path} {line}     assert True", "test", "submit"]
            )
            env, turns, info = domain.make_env(), [], {}
            obs = env.reset(task)
            for a in actions:
                obs, done, info = env.step(a + "\n")
                turns.append(Turn(a + "\n", 4, -0.5, obs, bool(info.get("tool_error"))))
                if done:
                    break
            terms, total = score(harness, domain, task, turns, info, "stop")
            rollouts.append(
                train_rollout(
                    "swe", "seg", step, i, harness, task, turns, terms, total, domain.audit(task, turns, info), info
                )
            )
        store.append(rollouts, f"seg-s{step:06d}")
    findings = Suite.default().run(store, "seg", 1, 2)
    tampering = next(f for f in findings if f.name == "test_tampering")
    brief = build_brief(
        run="swe",
        rnd=1,
        domain="swe",
        harness=harness,
        findings=findings,
        store=store,
        branches=["seg"],
        ledger=ledger,
        skills=[],
        limit=1,
        explore=0.0,
    )
    ledger.close()
    fake = FakeLLM(['{"interventions": []}'])
    try:
        cfg = small_config(tmp_path, llm={"base_url": fake.url, "model": MODEL})
        LLMProposer.from_config(cfg.llm, tmp_path / "run", cfg.run.seed).propose(brief)
    finally:
        fake.close()
    sent = fake.prompt()
    [r] = store.query(f"id = '{tampering.evidence[0]}'")
    assert (
        "assert True" in "".join(t["action"] for t in r["turns"])
        and r["rewards"]["tests"] == 1.0
        and r["audit"] is False
    )
    block = sent[sent.index(f"### rollout {r['id']}") : sent.index(f"----- end of {r['id']} -----")]
    assert r["prompt"] in block and "audit FAILED" in block and "test_tampering" in block
    for t in r["turns"]:
        assert t["action"] in block and t["observation"] in block  # every turn, verbatim
    assert json.dumps(r["info"], sort_keys=True, default=str) in block


# -- structured output and small models ------------------------------------------------------------------------------
def test_structured_output_is_asked_for_and_a_refusal_steps_down_for_good(llm_run):
    """A JSON schema first; a server that refuses it is asked for a JSON object, then for plain text, and the
    refusals are no retries spent and are remembered."""
    fake = FakeLLM(
        [
            (400, "response_format json_schema is not supported"),
            (400, "unsupported response_format"),
            '{"interventions": []}',
            '{"interventions": []}',
        ]
    )
    try:
        client = LLMClient(fake.url, MODEL, None, backoff_seconds=0.01, max_retries=0)
        reply = client.chat([{"role": "user", "content": "hi"}], {"type": "object"})
        assert reply.text == '{"interventions": []}' and len(reply.attempts) == 2
        formats = [r.get("response_format", {}).get("type") for r in fake.requests]
        assert formats == ["json_schema", "json_object", None]
        assert fake.requests[0]["response_format"]["json_schema"]["schema"] == {"type": "object"}
        client.chat([{"role": "user", "content": "again"}], {"type": "object"})
        assert "response_format" not in fake.requests[-1]
    finally:
        fake.close()


def test_a_small_model_chooses_from_the_catalog_s_menu_and_a_bad_choice_falls_back(llm_run, tmp_path):
    """The compact brief (llm.brief compact, or auto at a context of 8k or less) offers the heuristic catalog's
    candidates by number; the model's choice is the proposal (source llm), screened like any. A choice that is
    no option is recorded and the catalog fills the slot (source heuristic)."""
    cfg, _, _, run_dir = llm_run
    fake = FakeLLM(['{"choose": [{"option": 2, "rationale": "the groups look alike"}]}', '{"choose": [99]}'])
    try:
        p = _proposer(cfg, fake, tmp_path, context_tokens=8192, max_output_tokens=512)
        out = p.propose(_brief(cfg, run_dir, limit=1)).proposals
        t = json.loads((tmp_path / "llm" / "007-1.json").read_text())
        assert t["brief"] == "compact" and len(t["options"]) >= 2
        assert [(x.source, x.intervention.describe()) for x in out] == [("llm", t["options"][1])]
        assert "the groups look alike" in out[0].note
        assert fake.requests[0]["response_format"]["json_schema"]["schema"]["required"] == ["choose"]
        assert "Options:" in fake.prompt(0) and len(fake.prompt(0)) < 8000
        bad = p.propose(dataclasses.replace(_brief(cfg, run_dir, limit=1), round=8)).proposals
        t = json.loads((tmp_path / "llm" / "008-1.json").read_text())
        assert "not an option number" in t["invalid"][0]
        assert [x.source for x in bad] == ["heuristic"] and "nothing usable" in bad[0].note
    finally:
        fake.close()


def test_a_prose_reply_that_quotes_options_whole_chooses_them_and_its_inventions_are_not_read(llm_run, tmp_path):
    """SmolLM2-135M behind a server that ignores response_format answers the menu in prose, copying some
    options whole and inventing others: the copied ones are chosen in the order quoted (a repair the
    transcript names), an invented knob move and an option's prefix are not."""
    cfg, _, _, run_dir = llm_run
    brief = _brief(cfg, run_dir, limit=2)
    probe = FakeLLM(['{"choose": [1]}'])
    try:
        _proposer(cfg, probe, tmp_path / "probe", context_tokens=8192).propose(brief)
        options = json.loads((tmp_path / "probe" / "llm" / "007-1.json").read_text())["options"]
    finally:
        probe.close()
    assert len(options) >= 3
    prose = (
        "The most promising interventions are:\n"
        f"1. {options[2]} (it should help)\n"
        "2. set_knob loss.epsilon_high: 1.0 -> 3e-05 (for explore)\n"
        f"3. {options[0]}7 (a longer value than the option's)\n"
        f"4. {options[1]}"
    )
    fake = FakeLLM([prose])
    try:
        out = _proposer(cfg, fake, tmp_path, context_tokens=8192).propose(brief).proposals
        t = json.loads((tmp_path / "llm" / "007-1.json").read_text())
        assert t["options"] == options and t["error"] is None
        assert any("quoted whole" in r for r in t["repairs"])
        assert [(x.source, x.intervention.describe()) for x in out] == [("llm", options[2]), ("llm", options[1])]
    finally:
        fake.close()
