"""The meeting point of a program and the episode that answers its model requests.

A program runs in its own thread (or a subprocess behind the endpoint's thread) and asks for a
completion with ``ModelChannel.ask``, which blocks until the episode answers. The episode, a
generator the runtime advances (``coevo.agent.program_episode``), takes the program's requests and its
end from ``ModelChannel.next`` in the order they happened. Once the episode is over the channel is
closed: a request still waiting, or one sent later by a program that outlived its episode, is
refused at once, so no program thread waits forever.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ChannelClosed(RuntimeError):
    """The episode behind the channel is over, or it refused the request (the message says why)."""


@dataclass(frozen=True)
class TokenRecord:
    """The exact ids a reply was conditioned on and sampled, and the sampler's log-probs: the same
    numbers the episode's ``ModelCall`` keeps, handed to a client that records tokens (verifiers')."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None


@dataclass
class PendingRequest:
    """One model request the program is waiting on: its body and, once answered, the response."""

    body: object
    response: dict[str, Any] | None = None
    refusal: str | None = None
    status: int = 200  # the HTTP status the endpoint answers with (400: malformed, 503: episode over)
    tokens: TokenRecord | None = None  # what the policy evaluated and sampled (None: no model call)
    done: threading.Event = field(default_factory=threading.Event)
    _callbacks: list[Callable[[], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, response: dict[str, Any], tokens: TokenRecord | None = None) -> None:
        self.response, self.tokens = response, tokens
        self._finish()

    def refuse(self, why: str, status: int = 400) -> None:
        self.refusal, self.status = why, status
        self._finish()

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once answered or refused (now, if it already is): an event loop waits
        on it without holding a thread per request."""
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def _finish(self) -> None:
        with self._lock:
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


@dataclass(frozen=True)
class ProgramEnded:
    """The program finished: its score (the env's ``Score``), or why it failed (``error``; the
    score is then None)."""

    score: object
    error: BaseException | None = None


class ModelChannel:
    """One episode's model requests, in order, and the program's end."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._queue: queue.Queue[PendingRequest | ProgramEnded] = queue.Queue()
        self._lock = threading.Lock()
        self._closed: str | None = None

    # the program's side
    def submit(self, body: object) -> PendingRequest:
        """Hand a request to the episode without waiting (the endpoint waits on ``done`` itself)."""
        pending = PendingRequest(body)
        with self._lock:
            if self._closed is not None:
                pending.refuse(self._closed, 503)
            else:
                self._queue.put(pending)
        return pending

    def ask(self, body: object) -> PendingRequest:
        """``body`` (a chat-completions request) answered by the episode: its ``response`` and
        ``tokens`` are set; ``ChannelClosed`` if the episode refused it."""
        pending = self.submit(body)
        pending.done.wait()
        if pending.response is None:
            raise ChannelClosed(pending.refusal or "refused")
        return pending

    def end(self, score: object, error: BaseException | None = None) -> None:
        """The program is done (called once, by whoever runs it)."""
        self._queue.put(ProgramEnded(score, error))

    # the episode's side
    def next(self, timeout_s: float) -> PendingRequest | ProgramEnded:
        """The program's next request or its end; ``queue.Empty`` after ``timeout_s`` of neither."""
        return self._queue.get(timeout=timeout_s)

    def close(self, why: str) -> None:
        """Refuse every request still waiting and every later one with ``why``."""
        with self._lock:
            self._closed = why
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, PendingRequest):
                    item.refuse(why, 503)
