"""The LLM client: any OpenAI-compatible chat endpoint (a hosted API, vLLM, Ollama, llama.cpp, LM Studio)
through the `openai` package, with a timeout per request, retries with backoff on transient errors, a
start-up check that the endpoint and model answer, and each reply's tokens and cost."""

from __future__ import annotations

import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from evotrainer.config import LLMSection
from evotrainer.errors import ConfigError

BASE_URL_ENV = "EVOTRAINER_LLM_BASE_URL"
MODEL_ENV = "EVOTRAINER_LLM_MODEL"
CHECK_SECONDS = 30.0  # the start-up check waits at most this long, whatever llm.timeout_seconds says


class LLMError(Exception):
    """An exchange that failed after its retries (endpoint down, refused, malformed answer)."""


@dataclass(frozen=True)
class Reply:
    """One completed request: the text, the token counts (the server's, or estimated from characters
    when it reports none), the cost at the configured prices, the seconds and the failed attempts."""

    text: str
    input_tokens: int
    output_tokens: int
    cost: float
    seconds: float
    estimated_tokens: bool = False
    finish_reason: str | None = None
    attempts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_tokens(text: str) -> int:
    """A conservative token count for budgeting prompts: about 3 characters a token for the mixed
    prose, JSON and code of a brief (English prose runs nearer 4)."""
    return len(text) // 3 + 1


def resolve(llm: LLMSection) -> tuple[str, str, str | None]:
    """(base_url, model, api key) from the config, falling back to the environment."""
    base_url = llm.base_url or os.environ.get(BASE_URL_ENV)
    model = llm.model or os.environ.get(MODEL_ENV)
    if not base_url:
        raise ConfigError(
            f"llm.base_url: not set; loop.proposer llm needs an OpenAI-compatible endpoint, e.g. "
            f"https://api.openai.com/v1 or http://localhost:11434/v1 (or set ${BASE_URL_ENV})"
        )
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"llm.base_url = {base_url!r}: must start with http:// or https://")
    if not model:
        raise ConfigError(f"llm.model: not set; name the model the endpoint serves (or set ${MODEL_ENV})")
    return base_url.rstrip("/"), model, os.environ.get(llm.api_key_env) or None


class LLMClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        *,
        timeout: float = 120.0,
        max_retries: int = 3,
        temperature: float = 0.2,
        max_output_tokens: int = 2048,
        price_input_per_1k: float = 0.0,
        price_output_per_1k: float = 0.0,
        backoff_seconds: float = 1.0,
        key_env: str = "EVOTRAINER_LLM_API_KEY",
    ):
        import openai

        self.base_url, self.model, self.key_env = base_url, model, key_env
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff_seconds
        self.temperature, self.max_output_tokens = temperature, max_output_tokens
        self.prices = (price_input_per_1k, price_output_per_1k)
        # Retries are ours (max_retries=0 here) so that each failed attempt is on the transcript.
        # A local server needs no key, but the client insists on one: any placeholder will do.
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "no-key", timeout=timeout, max_retries=0)
        # What the server is asked to constrain its output to: a JSON schema where the request carries one (vLLM,
        # llama.cpp, Ollama, hosted APIs), else a JSON object; each dropped for good after a server refuses it.
        # Some servers (transformers serve) ignore response_format without an error: the reply is checked anyway.
        self._formats = ["json_schema", "json_object"]

    @classmethod
    def from_config(cls, llm: LLMSection) -> LLMClient:
        base_url, model, key = resolve(llm)
        if llm.max_output_tokens * 4 > llm.context_tokens:
            # A re-ask holds the brief, the first reply and room for the second: the brief needs the rest.
            raise ConfigError(
                f"llm.max_output_tokens = {llm.max_output_tokens}: at most a quarter of llm.context_tokens "
                f"({llm.context_tokens}), or too little room is left for the brief"
            )
        return cls(
            base_url,
            model,
            key,
            timeout=llm.timeout_seconds,
            max_retries=llm.max_retries,
            temperature=llm.temperature,
            max_output_tokens=llm.max_output_tokens,
            price_input_per_1k=llm.price_input_per_1k,
            price_output_per_1k=llm.price_output_per_1k,
            key_env=llm.api_key_env,
        )

    # -- the start-up check ------------------------------------------------------------------------------------
    def check(self) -> dict[str, Any]:
        """Raise ConfigError unless the endpoint answers and serves the model: list the models, and
        where the list does not name it (or the server has no list), ask for one token."""
        import openai

        client = self._client.with_options(timeout=min(self.timeout, CHECK_SECONDS))
        served: list[str] = []
        try:
            served = [m.id for m in client.models.list()]
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            raise ConfigError(
                f"llm.base_url: cannot reach {self.base_url} ({_cause(e)}); is the server running and the URL "
                "right (it usually ends in /v1)?"
            ) from None
        except openai.AuthenticationError:
            raise ConfigError(
                f"llm: {self.base_url} refused the API key; set ${self.key_env} to a valid key"
            ) from None
        except openai.APIStatusError:
            pass  # some servers have no model list: the one-token request below decides
        if self.model in served:
            return {"served": served, "probe": "models"}
        try:
            client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": "ok"}], max_tokens=1
            )
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            raise ConfigError(f"llm.base_url: cannot reach {self.base_url} ({_cause(e)})") from None
        except openai.AuthenticationError:
            raise ConfigError(
                f"llm: {self.base_url} refused the API key; set ${self.key_env} to a valid key"
            ) from None
        except (openai.NotFoundError, openai.BadRequestError) as e:
            hint = f"; it serves: {', '.join(served[:20])}" if served else ""
            raise ConfigError(
                f"llm.model: {self.model!r} is not served at {self.base_url} ({_status(e)}){hint}"
            ) from None
        except openai.APIStatusError as e:
            raise ConfigError(
                f"llm: {self.base_url} answered a one-token request for {self.model!r} with {_status(e)}"
            ) from None
        return {"served": served, "probe": "chat"}

    # -- one exchange ---------------------------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, str]], schema: dict[str, Any] | None = None) -> Reply:
        """One completion with retries on transient errors (connection, timeout, 429, 5xx), backing off
        1, 2, 4... seconds with jitter (or as the server's Retry-After says), its output constrained to `schema`
        where the server can. Raises LLMError."""
        import openai

        attempts: list[str] = []
        t0 = time.perf_counter()
        attempt = 0  # transient failures; a refused response_format is no attempt (the request is asked again)
        while attempt <= self.max_retries:
            kwargs: dict[str, Any] = {
                "model": self.model,
                "messages": messages,
                "temperature": self.temperature,
                "max_tokens": self.max_output_tokens,
            }
            fmt = next((f for f in self._formats if f != "json_schema" or schema), None)
            if fmt == "json_schema":
                kwargs["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "reply", "schema": schema, "strict": False},
                }
            elif fmt == "json_object":
                kwargs["response_format"] = {"type": "json_object"}
            try:
                resp = self._client.chat.completions.create(**kwargs)
            except (openai.BadRequestError, openai.UnprocessableEntityError) as e:
                if fmt and ("response_format" in str(e) or "json_schema" in str(e)):
                    # LM Studio and some llama.cpp builds refuse one form or both: ask with the next from now on.
                    self._formats.remove(fmt)
                    attempts.append(f"response_format {fmt} refused ({_status(e)}); asking without it")
                    continue
                raise LLMError(f"the endpoint refused the request: {_status(e)}") from None
            except (
                openai.APIConnectionError,
                openai.APITimeoutError,
                openai.RateLimitError,
                openai.InternalServerError,
            ) as e:
                attempts.append(f"{type(e).__name__}: {_status(e)}")
                if attempt == self.max_retries:
                    raise LLMError(f"gave up after {attempt + 1} attempt(s): {'; '.join(attempts)}") from None
                time.sleep(_retry_after(e) or self.backoff * 2**attempt * (1 + 0.25 * random.random()))
                attempt += 1
                continue
            except openai.APIStatusError as e:
                raise LLMError(f"the endpoint answered {_status(e)}") from None
            return self._reply(resp, messages, time.perf_counter() - t0, attempts)
        raise LLMError(f"gave up: {'; '.join(attempts)}")

    def _reply(self, resp: Any, messages: list[dict[str, str]], seconds: float, attempts: list[str]) -> Reply:
        choice = resp.choices[0] if getattr(resp, "choices", None) else None
        text = (choice.message.content or "") if choice is not None and choice.message is not None else ""
        usage = getattr(resp, "usage", None)
        if usage is not None and usage.prompt_tokens is not None:
            tin, tout, est = int(usage.prompt_tokens), int(usage.completion_tokens or 0), False
        else:  # a server that reports no usage: estimate, and say so on the transcript
            tin, tout, est = sum(estimate_tokens(m["content"]) for m in messages), estimate_tokens(text), True
        cost = tin / 1000 * self.prices[0] + tout / 1000 * self.prices[1]
        return Reply(text, tin, tout, cost, seconds, est, getattr(choice, "finish_reason", None), attempts)


def _status(e: Exception) -> str:
    code = getattr(e, "status_code", None)
    msg = str(getattr(e, "message", "") or e).splitlines()[0][:300]
    return f"HTTP {code}: {msg}" if code else msg


def _cause(e: Exception) -> str:
    inner = e.__cause__ or e.__context__
    return f"{type(inner).__name__}: {inner}"[:300] if inner else str(e)[:300]


def _retry_after(e: Exception) -> float | None:
    resp = getattr(e, "response", None)
    try:
        v = float(resp.headers.get("retry-after")) if resp is not None else None
    except (TypeError, ValueError):
        return None
    return min(v, 60.0) if v is not None and v >= 0 else None
