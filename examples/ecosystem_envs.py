"""Rows written for skyrl-gym, built locally (no hub download): what a researcher who already has
a skyrl-gym environment would bring. Nothing here knows about coevo; docs/environments.md runs it:

    coevo eval --env skyrl_gym --env-arg env_class=gsm8k --env-arg rows=examples.ecosystem_envs:gsm8k_rows \
        --harness function_calling --model gold

- ``gsm8k_rows``: rows in SkyRL's dataset format for its built-in ``gsm8k`` environments.

verifiers 0.4 tasksets (the v1 API) live in ``examples/verifiers_v1/``.
"""

from __future__ import annotations

import random


def _problems(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
        rows.append({"question": f"What is {a} times {b}, plus {c}? Reply with the number only.",
                     "answer": str(a * b + c)})
    return rows


def gsm8k_rows(n: int = 30, seed: int = 0) -> list[dict]:
    """Rows as SkyRL's dataset scripts write them (``prompt``, ``env_class``, ``reward_spec``)."""
    return [{"prompt": [{"role": "user", "content": f"{row['question'].removesuffix(' Reply with the number only.')}"
                                                    " Give the final answer after '####'."}],
             "env_class": "gsm8k", "reward_spec": {"method": "rule", "ground_truth": row["answer"]},
             "extra_info": {"max_turns": 3}, "data_source": "times_plus"}
            for row in _problems(n, seed)]
