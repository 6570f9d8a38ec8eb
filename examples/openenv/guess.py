"""A small OpenEnv environment, written as OpenEnv's own docs write one: guess a secret integer.

``Environment`` subclass with pydantic ``Action`` / ``Observation`` models, served by OpenEnv's
``create_app`` (a FastAPI app: ``/ws`` sessions, ``/schema``, ``/reset``, ``/step``). Nothing here
knows about coevo; ``env=openenv env.args.app=examples.openenv.guess:app`` serves it on the loopback
interface and plays it. Reset arguments: ``target`` (the secret), ``high`` (the range is 1..high),
``max_attempts``. A right guess is reward 1 and ends the episode; a wrong one is told higher or lower.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    """Your guess of the secret integer."""

    guess: int = Field(..., description="your guess of the secret integer")


class GuessObservation(Observation):
    message: str = Field(default="", description="what the environment says")
    attempts_left: int = Field(default=0, description="guesses left")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each WebSocket session gets its own instance

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()))
        self.target, self.left = 1, 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, target: int = 7, high: int = 16,
              max_attempts: int = 5, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()))
        self.target, self.left = target, max_attempts
        return GuessObservation(message=f"I picked a secret integer from 1 to {high}. Guess it: reply with JSON "
                                        'like {"guess": 8}.', attempts_left=max_attempts)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        self.left -= 1
        if action.guess == self.target:
            return GuessObservation(message="Correct!", attempts_left=self.left, done=True, reward=1.0)
        hint = "higher" if action.guess < self.target else "lower"
        return GuessObservation(message=f"{action.guess} is wrong; the secret is {hint}.", attempts_left=self.left,
                                done=self.left <= 0, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=64)
