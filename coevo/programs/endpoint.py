"""An OpenAI-compatible chat-completions endpoint any agent program can be pointed at.

``OPENAI_BASE_URL=http://127.0.0.1:PORT/s/<session>/v1`` (what ``ModelEndpoint.base_url`` gives)
routes a program's requests to its episode's ``ModelChannel``; a program that cannot change its
base URL per episode may use the shared ``/v1`` and carry the session as its API key
(``OPENAI_API_KEY=<session>``: the ``Authorization: Bearer`` header) or an ``X-Session-Id`` header.
``POST .../chat/completions`` answers with the episode's reply (``stream: true`` gets the same reply
as one server-sent chunk); ``GET .../models`` lists the one model. A body coevo cannot read is a
400 with the reason, a request for an episode that is over or unknown a 503 or 404.

The server is a stdlib ``ThreadingHTTPServer`` on the loopback interface, one thread per
connection; the episode answers on the runtime's own threads. One endpoint serves a whole process
(``shared_endpoint``), started on first use.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from coevo.programs.channel import ModelChannel
from coevo.programs.chat_api import MalformedRequest

HOST = "127.0.0.1"


class ModelEndpoint:
    """The HTTP server and the channels of the episodes it serves, by session id."""

    def __init__(self, host: str = HOST, port: int = 0, model: str = "coevo") -> None:
        self.model = model
        self._channels: dict[str, ModelChannel] = {}
        self._lock = threading.Lock()
        endpoint = self

        class Handler(_Handler):
            owner = endpoint

        self._server = _Server((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="coevo-endpoint", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}" if isinstance(host, str) else f"http://{host.decode()}:{port}"

    def base_url(self, session_id: str) -> str:
        """The ``OPENAI_BASE_URL`` of one episode."""
        return f"{self.url}/s/{session_id}/v1"

    def register(self, channel: ModelChannel) -> str:
        """Serve ``channel``'s episode; its base URL."""
        with self._lock:
            self._channels[channel.session_id] = channel
        return self.base_url(channel.session_id)

    def unregister(self, session_id: str) -> None:
        with self._lock:
            self._channels.pop(session_id, None)

    def channel(self, session_id: str) -> ModelChannel | None:
        with self._lock:
            return self._channels.get(session_id)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


_shared: ModelEndpoint | None = None
_shared_lock = threading.Lock()


def shared_endpoint() -> ModelEndpoint:
    """The process's endpoint, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ModelEndpoint()
        return _shared


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: object) -> None:
        """A program killed while it waited (its episode failed or timed out) leaves a broken pipe:
        nothing to report, the episode already says why."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    owner: ModelEndpoint
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        """Quiet: one line per request would drown the run's progress."""

    def _route(self) -> tuple[str | None, str]:
        """(session id or None, the path after ``/v1``)."""
        path = self.path.split("?", 1)[0].rstrip("/")
        session = None
        if path.startswith("/s/"):
            session, _, path = path[3:].partition("/")
            path = "/" + path
        if session is None:
            auth = self.headers.get("Authorization", "")
            session = self.headers.get("X-Session-Id") or (auth[7:].strip() if auth.startswith("Bearer ") else None)
        return session, path.removeprefix("/v1")

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if status == 400 else "server_error"
        self._send(status, {"error": {"message": message, "type": kind, "code": status}})

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        _, path = self._route()
        if path == "/models":
            self._send(200, {"object": "list", "data": [{"id": self.owner.model, "object": "model",
                                                         "owned_by": "coevo"}]})
        else:
            self._error(404, f"no such path {self.path!r}")

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        session, path = self._route()
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if path != "/chat/completions":
            self._error(404, f"no such path {self.path!r}; coevo serves POST /v1/chat/completions")
            return
        channel = self.owner.channel(session) if session else None
        if channel is None:
            self._error(404, f"no episode with session {session!r} (use the base URL coevo gave the program)")
            return
        try:
            body: object = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            body = MalformedRequest(f"the request body is not JSON: {err}")  # the episode fails with it
        pending = channel.submit(body)
        pending.done.wait()
        if pending.response is None:
            self._error(pending.status, pending.refusal or "refused")
        elif isinstance(body, dict) and body.get("stream"):
            self._stream(pending.response)
        else:
            self._send(200, pending.response)

    def _stream(self, response: dict[str, Any]) -> None:
        """The whole reply as one chat-completion chunk, then ``[DONE]`` (server-sent events)."""
        choice = response["choices"][0]
        delta = {k: v for k, v in choice["message"].items() if v is not None}
        for k, call in enumerate(delta.get("tool_calls", [])):
            call["index"] = k
        chunk = {**response, "object": "chat.completion.chunk",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": choice["finish_reason"]}]}
        data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
