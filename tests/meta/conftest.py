"""Fixtures of the meta-agent tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def sdk_waits(monkeypatch) -> list[float]:
    """The openai SDK retries transient failures itself, waiting 0.5 s, 1 s, ... in between; here it
    waits 0 s and records the wait it would have made, so a test can count the retries. The SDK has
    no public setting for its backoff: this patches the method its own tests patch."""
    import openai

    waits: list[float] = []
    compute = openai.OpenAI._calculate_retry_timeout

    def no_wait(self, *args, **kwargs) -> float:
        waits.append(compute(self, *args, **kwargs))
        return 0.0

    monkeypatch.setattr(openai.OpenAI, "_calculate_retry_timeout", no_wait)
    return waits
