"""The LLM proposer: the brief goes to an OpenAI-compatible model, which answers with interventions (and
optional detectors) as JSON. Output is repaired where the repair is unambiguous, checked against the
same schema and `screen` as the heuristic's, and re-asked once with the reasons when something cannot be
used; what still fails is dropped and recorded. Every exchange is a transcript in run_dir/llm/."""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evotrainer.config import LLMSection
from evotrainer.diagnostics import agent
from evotrainer.harness.interventions import Intervention
from evotrainer.proposers.brief import check_isolation
from evotrainer.proposers.heuristic import HeuristicProposer
from evotrainer.proposers.llm_client import LLMClient, LLMError, Reply, estimate_tokens
from evotrainer.proposers.llm_menu import MENU_SYSTEM, chosen, menu_options, menu_schema, render_menu, salvage
from evotrainer.proposers.llm_prompt import SYSTEM, Rendered, feedback, render, reply_schema
from evotrainer.proposers.proposer import Brief, Proposal, ProposerOutput, Refusal, intervention_key, screen
from evotrainer.store.files import atomic_write_json
from evotrainer.store.ledger import Charge, Ledger

FIELDS = ("kind", "target", "value", "hypothesis")
FEEDBACK_TOKENS = 512  # what a re-ask's feedback message may take
COMPACT_CONTEXT = 8192  # llm.brief auto: a model with this context or less gets the compact brief (llm_menu.py)


class LLMProposer:
    name = "llm"

    def __init__(self, client: LLMClient, llm: LLMSection, run_dir: Path, ledger: Ledger | None = None, seed: int = 0):
        self.client, self.llm, self.run_dir, self.ledger = client, llm, Path(run_dir), ledger
        self.seed = seed  # of the heuristic catalog, which makes the compact brief's menu and fills empty slots
        self._charge = Charge()  # this round's spend so far (what `propose` returns)
        self._spent = Charge()  # everything spent through this proposer: the cost cap without a ledger

    @classmethod
    def from_config(cls, llm: LLMSection, run_dir: str | Path, seed: int, ledger: Ledger | None = None) -> LLMProposer:
        """Check the endpoint now (ConfigError if it is unset, unreachable, refuses the key or does not
        serve the model), so a bad endpoint stops the run at start-up and not in a round. Writes nothing."""
        client = LLMClient.from_config(llm)
        client.check()
        return cls(client, llm, Path(run_dir), ledger, seed=seed)

    # -- propose ----------------------------------------------------------------------------------------------------
    def propose(self, brief: Brief) -> ProposerOutput:
        """The full brief, or the compact one for a small model; then the slots the model left empty (nothing
        usable, an endpoint down, the cost cap reached) filled from the heuristic catalog, marked as such. Never
        raises for what the model writes or for a failed endpoint; the transcripts say what happened."""
        check_isolation(brief)  # the loop built it; check again at the door of the only component that talks outside
        self._charge = Charge()
        compact = self.llm.brief == "compact" or (
            self.llm.brief == "auto" and self.llm.context_tokens <= COMPACT_CONTEXT
        )
        accepted, detectors = self._menu_round(brief) if compact else self._full_round(brief)
        accepted += self._fallback(brief, accepted)
        # The LLM's tokens, cost and seconds: the loop charges them to `propose`. The detectors go to
        # revision.admit as written.
        return ProposerOutput(accepted, detectors, {"llm": self._charge} if self._charge != Charge() else {})

    def _fallback(self, brief: Brief, accepted: list[Proposal]) -> list[Proposal]:
        """The heuristic catalog's proposals for the slots the model did not fill, screened with the model's."""
        if len(accepted) >= brief.limit:
            return []
        why = "the LLM proposed nothing usable" if not accepted else f"the LLM filled {len(accepted)} slot(s)"
        extra = [
            Proposal(p.intervention, "heuristic", p.skill_id, f"fallback ({why}): {p.note}".rstrip(": "))
            for p in HeuristicProposer(self.seed).propose(brief).proposals
        ]
        _, fresh, _, _ = _screened(accepted, extra, brief)
        return fresh[: brief.limit - len(accepted)]

    def _menu_round(self, brief: Brief) -> tuple[list[Proposal], list[dict[str, Any]]]:
        """One exchange of the compact brief: the model picks from the catalog's candidates by number."""
        menu = render_menu(brief, menu_options(brief, self.seed))
        messages = [{"role": "system", "content": MENU_SYSTEM}, {"role": "user", "content": menu.text}]
        rendered = Rendered(menu.text, [], [], tokens=estimate_tokens(menu.text))
        record = {**self._record_head(brief.round, 1, rendered), "brief": "compact", "messages": messages}
        if not menu.options:
            self._write(brief.round, 1, {**record, "skipped": "the catalog has no candidate to offer"})
            return [], []
        if (cap := self._over_cost()) is not None:
            self._write(brief.round, 1, {**record, "skipped": cap})
            return [], []
        try:
            reply, cached = self._exchange(brief.round, 1, messages, menu_schema(len(menu.options), brief.limit))
        except LLMError as e:
            self._write(brief.round, 1, {**record, "error": str(e)})
            return [], []
        obj, repairs, error = parse_reply(reply.text, reply.finish_reason, keys=("choose",))
        if obj is None:
            obj, how = salvage(reply.text, menu)
            if obj is not None:
                repairs.append(f"{how} ({error})")
                error = None
        picks, item_errors = chosen(obj, menu)
        note = f"llm {self.client.model}, round {brief.round}, chosen from the catalog's menu"
        new = [Proposal(iv, "llm", None, f"{note}: {why}" if why else note) for iv, why in picks]
        accepted, fresh, _, refusals = _screened([], new, brief)
        self._write(
            brief.round,
            1,
            {
                **record,
                "options": [iv.describe() for iv in menu.options],
                "response": reply.text,
                "cached": cached,
                "finish_reason": reply.finish_reason,
                "parsed": obj,
                "repairs": repairs,
                "error": error,
                "invalid": item_errors,
                "refusals": refusals,
                "accepted": [_dump(p) for p in fresh if p in accepted],
                **_usage(reply),
            },
        )
        return accepted, []

    def _full_round(self, brief: Brief) -> tuple[list[Proposal], list[dict[str, Any]]]:
        """At most two exchanges: the brief, and one re-ask with the reasons when the reply could not be
        used as it stood; a round without usable output proposes nothing, and its transcript says why."""
        # Room for two replies and the feedback between them: a re-ask resends the brief with both.
        budget = self.llm.context_tokens - 2 * self.llm.max_output_tokens - FEEDBACK_TOKENS - estimate_tokens(SYSTEM)
        rendered = render(brief, budget)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": rendered.text}]
        accepted: list[Proposal] = []
        detectors: dict[str, Any] = {}  # by name, so a re-ask's corrected detector replaces the first; all go to admit
        for n in (1, 2):
            record = self._record_head(brief.round, n, rendered)
            if (cap := self._over_cost()) is not None:
                self._write(brief.round, n, {**record, "messages": messages, "skipped": cap})
                break
            try:
                reply, cached = self._exchange(brief.round, n, messages, reply_schema(brief))
            except LLMError as e:
                self._write(brief.round, n, {**record, "messages": messages, "error": str(e)})
                break
            if (warning := _cut_prompt_warning(reply, messages)) is not None:
                record["warning"] = warning
            obj, repairs, error = parse_reply(reply.text, reply.finish_reason)
            new, item_errors, det_errors = self._read_reply(obj, brief.round, n, detectors)
            accepted, fresh, refused, refusals = _screened(accepted, new, brief)
            self._write(
                brief.round,
                n,
                {
                    **record,
                    "messages": messages,
                    "response": reply.text,
                    "cached": cached,
                    "finish_reason": reply.finish_reason,
                    "parsed": obj,
                    "repairs": repairs,
                    "error": error,
                    "invalid": item_errors,
                    "refusals": refusals,
                    "detector_errors": det_errors,
                    "accepted": [_dump(p) for p in fresh if p in accepted],
                    "detectors": list(detectors.values()),
                    **_usage(reply),
                },
            )
            problems = bool(error or item_errors or det_errors or [r for r in refused if r.proposal in new])
            if n == 2 or not problems or (len(accepted) >= brief.limit and not det_errors and not error):
                break
            messages = _reask(messages, reply, error, item_errors, refusals, accepted, det_errors, brief.limit)
        return accepted, list(detectors.values())

    def _record_head(self, rnd: int, n: int, rendered: Rendered) -> dict[str, Any]:
        """What every transcript of an exchange starts with: round, model, endpoint and the evidence shown."""
        return {
            "round": rnd,
            "exchange": n,
            "model": self.client.model,
            "base_url": self.client.base_url,
            "evidence": {"shown": rendered.shown, "left_out": rendered.left_out, "too_long": rendered.too_long},
            "prompt_tokens_estimated": rendered.tokens,
        }

    def _read_reply(
        self, obj: dict[str, Any] | None, rnd: int, n: int, detectors: dict[str, Any]
    ) -> tuple[list[Proposal], list[str], list[str]]:
        """(proposals, intervention errors, detector errors) of a reply; its detectors go into `detectors` by name."""
        item_errors: list[str] = []
        new: list[Proposal] = []
        det_errors: list[str] = []
        if obj is None:
            return new, item_errors, det_errors
        note = f"llm {self.client.model}, round {rnd} exchange {n}: " + str(obj.get("diagnosis", ""))[:400]
        for k, item in enumerate(obj.get("interventions") or []):
            iv = _intervention(item)
            if isinstance(iv, str):
                item_errors.append(f"interventions[{k}]: {iv}")
            else:
                new.append(Proposal(iv, "llm", None, note))
        for k, d in enumerate(obj.get("detectors") or []):
            key = str(d.get("name")) if isinstance(d, dict) and d.get("name") else f"#{n}.{k}"
            detectors[key] = d
            try:
                agent.parse(d)
            except ValueError as e:
                det_errors.append(f"detectors[{k}]: {e}")
        return new, item_errors, det_errors

    # -- one exchange, its charge and its transcript ------------------------------------------------------------------
    def _exchange(
        self, rnd: int, n: int, messages: list[dict[str, str]], schema: dict[str, Any] | None = None
    ) -> tuple[Reply, bool]:
        """The reply, live or, when a resumed round asks exactly what its transcript already holds, that
        transcript's (the decisions then match the interrupted run's; its spend is charged again, since
        the interrupted stage's charges were never committed)."""
        key = _digest(self.client.model, messages)
        path = self._path(rnd, n)
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except (OSError, ValueError):
                old = {}
            if old.get("prompt_sha") == key and "response" in old:
                reply = Reply(
                    old["response"],
                    old["input_tokens"],
                    old["output_tokens"],
                    old["cost"],
                    old["seconds"],
                    old.get("estimated_tokens", False),
                    old.get("finish_reason"),
                    old.get("attempts", []),
                )
                self._add(reply)
                return reply, True
        try:
            reply = self.client.chat(messages, schema)
        except LLMError:
            self._add(Reply("", 0, 0, 0.0, 0.0))
            raise
        self._add(reply)
        return reply, False

    def _add(self, r: Reply) -> None:
        ch = Charge(
            seconds=r.seconds, llm_input_tokens=r.input_tokens, llm_output_tokens=r.output_tokens, llm_cost=r.cost
        )
        self._charge, self._spent = self._charge + ch, self._spent + ch

    def _over_cost(self) -> str | None:
        if not self.llm.max_cost:
            return None
        # With a ledger, what earlier rounds spent is recorded there; this round's spend is not yet.
        spent = (
            self.ledger.spent().llm_cost + self._charge.llm_cost if self.ledger is not None else self._spent.llm_cost
        )
        return f"llm.max_cost {self.llm.max_cost} reached (spent {spent:.4f})" if spent >= self.llm.max_cost else None

    def _path(self, rnd: int, n: int) -> Path:
        return self.run_dir / "llm" / f"{rnd:03d}-{n}.json"

    def _write(self, rnd: int, n: int, record: dict[str, Any]) -> Path:
        path = self._path(rnd, n)
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {**record, "prompt_sha": _digest(self.client.model, record["messages"]), "written": time.time()}
        return atomic_write_json(path, record, indent=1)


def _cut_prompt_warning(reply: Reply, messages: list[dict[str, str]]) -> str | None:
    """A warning when the server counted far fewer prompt tokens than were sent, or None."""
    sent = sum(estimate_tokens(m["content"]) for m in messages)
    if not reply.estimated_tokens and reply.input_tokens < 0.4 * sent:
        # Ollama and some llama.cpp setups cut a prompt longer than their context without an error.
        return (
            f"the server counted {reply.input_tokens} prompt tokens for about {sent} sent: it may have cut "
            "the prompt; raise the server's context (Ollama: OLLAMA_CONTEXT_LENGTH) "
            "or lower llm.context_tokens"
        )
    return None


def _screened(
    accepted: list[Proposal], new: list[Proposal], brief: Brief
) -> tuple[list[Proposal], list[Proposal], list[Refusal], list[str]]:
    """(accepted, this reply's that passed, refused, refusals as text) after screening, capped at the round's limit."""
    # The loop's own screen: the same checks every proposer's output gets (one knob, in range,
    # not a duplicate, not already rejected under this signature).
    kept, refused = screen(accepted + new, brief)
    fresh = kept[len(accepted) :]
    over = fresh[max(0, brief.limit - len(accepted)) :]
    accepted = kept[: brief.limit]
    refusals = [f"{r.proposal.intervention.describe()}: {r.reason}" for r in refused]
    refusals += [f"{p.intervention.describe()}: over this round's limit of {brief.limit}" for p in over]
    return accepted, fresh, refused, refusals


def _usage(reply: Reply) -> dict[str, Any]:
    """The transcript's record of what an exchange cost: attempts, tokens, money and seconds."""
    return {
        "attempts": reply.attempts,
        "input_tokens": reply.input_tokens,
        "output_tokens": reply.output_tokens,
        "estimated_tokens": reply.estimated_tokens,
        "cost": reply.cost,
        "seconds": reply.seconds,
    }


def _reask(
    messages: list[dict[str, str]],
    reply: Reply,
    error: str | None,
    item_errors: list[str],
    refusals: list[str],
    accepted: list[Proposal],
    det_errors: list[str],
    limit: int,
) -> list[dict[str, str]]:
    """The conversation for the re-ask: the reply, then the feedback on what could not be used."""
    errors = ([error] if error else []) + item_errors
    return messages + [
        {"role": "assistant", "content": reply.text},
        {
            "role": "user",
            "content": feedback(
                errors,
                [r for r in refusals if "over this round" not in r],
                [p.intervention.describe() for p in accepted],
                det_errors,
                limit,
            ),
        },
    ]


def check_endpoint(llm: LLMSection) -> None:
    """The start-up check alone (ConfigError), for callers that want it before writing anything."""
    LLMClient.from_config(llm).check()


# -- reading the model's output ---------------------------------------------------------------------------------------
def parse_reply(
    text: str, finish_reason: str | None = None, keys: tuple[str, ...] = ("interventions", "detectors")
) -> tuple[dict[str, Any] | None, list[str], str | None]:
    """(object, repairs applied, error). Repairs are the unambiguous ones: a code fence or prose around
    one JSON object, comments, trailing commas, single-quoted strings, Python's True / False / None,
    a bare list (of interventions, or of the compact brief's choices) or a single intervention object. Anything
    else is an error. `keys`: the lists the object may hold (one of them at least)."""
    repairs: list[str] = []
    s = (text or "").strip()
    if not s:
        return None, repairs, "the reply is empty"
    fences = re.findall(r"```[A-Za-z]*\s*\n?(.*?)```", s, re.S)
    if len(fences) > 1:
        return None, repairs, f"the reply holds {len(fences)} code blocks; answer with ONE JSON object"
    if fences:
        s = fences[0].strip()
        repairs.append("code fence removed")
    if not s.startswith(("{", "[")):
        lo, hi = s.find("{"), s.rfind("}")
        if lo < 0 or hi < lo:
            return None, repairs, "no JSON object found in the reply"
        s = s[lo : hi + 1]
        repairs.append("text around the JSON object removed")
    try:
        obj = json.loads(s, strict=False)
    except ValueError:
        fixed, changes = _normalize(s)
        try:
            obj = json.loads(fixed, strict=False)
            repairs += changes
        except ValueError as e:
            cut = (
                " (the reply was cut at llm.max_output_tokens: answer more briefly)"
                if finish_reason == "length"
                else ""
            )
            return None, repairs, f"not valid JSON: {e}{cut}"
    if isinstance(obj, list):
        obj = {keys[0]: obj}
        repairs.append(f"a bare list read as the {keys[0]}")
    if isinstance(obj, dict) and "kind" in obj and "interventions" not in obj:
        obj = {"interventions": [obj]}
        repairs.append("a single intervention read as a list of one")
    if not isinstance(obj, dict):
        return None, repairs, f"the reply must be a JSON object, got {type(obj).__name__}"
    for key in keys:
        if key in obj and not isinstance(obj[key], list):
            return None, repairs, f"`{key}` must be a list"
    if not any(key in obj for key in keys):
        return None, repairs, f"the object has no {' or '.join(f'`{k}`' for k in keys)}"
    return obj, repairs, None


def _normalize(s: str) -> tuple[str, list[str]]:
    """JSON from near-JSON, outside strings only: comments dropped, trailing commas dropped, single-quoted
    strings and Python's True / False / None converted. Returns the text and the repairs made."""
    out: list[str] = []
    changes: set[str] = set()
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == '"':
            j = i + 1
            while j < n and s[j] != '"':
                j += 2 if s[j] == "\\" else 1
            out.append(s[i : j + 1])
            i = j + 1
        elif c == "'":
            j, buf = i + 1, []
            while j < n and s[j] != "'":
                if s[j] == "\\" and j + 1 < n:
                    buf.append(s[j + 1] if s[j + 1] in "'\\" else s[j : j + 2].encode().decode("unicode_escape"))
                    j += 2
                else:
                    buf.append(s[j])
                    j += 1
            out.append(json.dumps("".join(buf)))
            changes.add("single-quoted strings converted")
            i = j + 1
        elif s.startswith("//", i) or c == "#":
            i = s.find("\n", i) if "\n" in s[i:] else n
            changes.add("comments removed")
        elif s.startswith("/*", i):
            end = s.find("*/", i + 2)
            i = n if end < 0 else end + 2
            changes.add("comments removed")
        elif c == ",":
            j = i + 1
            while j < n and s[j].isspace():
                j += 1
            if j < n and s[j] in "}]":
                changes.add("trailing commas removed")
            else:
                out.append(c)
            i += 1
        elif (m := re.match(r"(True|False|None)\b", s[i:])) and (
            i == 0 or not (s[i - 1].isalnum() or s[i - 1] == "_")
        ):
            out.append({"True": "true", "False": "false", "None": "null"}[m.group(1)])
            changes.add("Python True / False / None converted")
            i += len(m.group(1))
        else:
            out.append(c)
            i += 1
    return "".join(out), sorted(changes)


def _intervention(item: Any) -> Intervention | str:
    """An Intervention from one item of the reply, or why not (the heuristic's schema; no binding fields)."""
    if not isinstance(item, dict):
        return f"an intervention is an object with {', '.join(FIELDS)}; got {type(item).__name__}"
    extra = sorted(set(item) - set(FIELDS))
    if extra:
        return f"unknown field(s) {extra}: an intervention has exactly {', '.join(FIELDS)}"
    try:
        return Intervention.model_validate(item)
    except ValidationError as e:
        return "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or 'intervention'}: {err['msg']}" for err in e.errors()
        )


def _dump(p: Proposal) -> dict[str, Any]:
    return {
        "intervention": p.intervention.model_dump(mode="json"),
        "key": intervention_key(p.intervention),
        "note": p.note,
    }


def _digest(model: str, messages: list[dict[str, str]]) -> str:
    return hashlib.sha256(json.dumps([model, messages], sort_keys=True).encode()).hexdigest()[:16]
