"""A scripted OpenAI-compatible chat server over real HTTP, in a thread: the LLM proposer's tests and the
earned-path test use it to play the model (a double for an external paid service)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "scripted-model"
Script = str | int | tuple[int, str] | Callable[[dict], str]


class FakeLLM:
    """GET /v1/models and POST /v1/chat/completions over HTTP. Each completion takes the next scripted
    reply: a string (the content), an int (that HTTP status, an error), a (status, message) pair (an error
    with that message) or a function of the request.
    A one-token request (the start-up probe) is answered without using the script."""

    def __init__(self, script: list[Script] = (), models: tuple[str, ...] = (MODEL,)):
        self.script, self.models, self.requests = list(script), models, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": m, "object": "model", "created": 0, "owned_by": "t"} for m in fake.models],
                        },
                    )
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if body.get("model") not in fake.models:
                    return self._send(404, {"error": {"message": f"model {body.get('model')} not found"}})
                if body.get("max_tokens") == 1:
                    return self._send(200, _completion("o", 1, 1))
                fake.requests.append(body)
                nxt = fake.script.pop(0) if fake.script else '{"interventions": []}'
                if isinstance(nxt, int):
                    return self._send(nxt, {"error": {"message": f"scripted {nxt}"}})
                if isinstance(nxt, tuple):
                    return self._send(nxt[0], {"error": {"message": nxt[1]}})
                content = nxt(body) if callable(nxt) else nxt
                prompt = sum(len(m["content"]) for m in body["messages"]) // 4
                self._send(200, _completion(content, prompt, len(content) // 4))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def prompt(self, k: int = -1) -> str:
        return "\n".join(m["content"] for m in self.requests[k]["messages"])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _completion(content: str, prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def iv(target: str, value: Any, kind: str = "set_knob", finding: str = "explore") -> dict:
    return {
        "kind": kind,
        "target": target,
        "value": value,
        "hypothesis": {"finding": finding, "signal": "heldout/accuracy", "direction": "up", "rationale": "test"},
    }
