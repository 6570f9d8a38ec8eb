"""Small environments written for the RL ecosystem's libraries, built locally (no hub download).

They are what a researcher who already has an environment in `verifiers` or `skyrl-gym` would
bring: nothing here knows about coevo. docs/environments.md runs them under coevo by name:

    coevo eval --env verifiers --env-arg environment=examples.ecosystem_envs:load_tool_env --model gold
    coevo eval --env skyrl_gym --env-arg env_class=gsm8k --env-arg rows=examples.ecosystem_envs:gsm8k_rows \
        --harness function_calling --model gold

- ``load_tool_env``: a verifiers ``ToolEnv``: arithmetic word problems with ``add`` and ``multiply``
  tools, scored by a rubric that compares the parsed answer with the row's;
- ``load_guess_env``: a verifiers ``MultiTurnEnv``: guess a number, the env answers higher or lower;
- ``load_single_env``: a verifiers ``SingleTurnEnv`` with an ``XMLParser``: reverse a word;
- ``gsm8k_rows``: rows in SkyRL's dataset format for its built-in ``gsm8k`` environments.
"""

from __future__ import annotations

import random

WORDS = ("coevo", "harness", "gradient", "verifier", "rollout", "tensor", "kernel", "buffer", "critic", "planner",
         "digest", "policy", "reward", "sample", "token", "prompt")


def _problems(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
        rows.append({"question": f"What is {a} times {b}, plus {c}? Reply with the number only.",
                     "answer": str(a * b + c)})
    return rows


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a * b


def load_tool_env(n: int = 40, seed: int = 0):
    """A ``vf.ToolEnv`` whose rubric gives 1 for the row's number and 0.2 for using a tool."""
    import verifiers as vf
    from datasets import Dataset

    parser = vf.Parser()

    def correct(completion, answer) -> float:
        reply = (parser.parse_answer(completion) or "").strip()
        return 1.0 if reply.split()[-1:] == [answer] else 0.0

    async def used_a_tool(completion) -> float:
        return 0.2 if any(getattr(m, "tool_calls", None) for m in completion) else 0.0

    rubric = vf.Rubric(funcs=[correct, used_a_tool], weights=[1.0, 1.0], parser=parser)
    return vf.ToolEnv(dataset=Dataset.from_list(_problems(n, seed)), tools=[add, multiply], rubric=rubric,
                      parser=parser, max_turns=6, system_prompt="Use the tools for the arithmetic.")


def load_guess_env(n: int = 30, high: int = 16, seed: int = 0):
    """A ``vf.MultiTurnEnv``: guess the hidden number in [1, high]; each wrong guess gets higher/lower."""
    import verifiers as vf
    from datasets import Dataset

    rng = random.Random(seed)
    rows = [{"question": f"I am thinking of a number from 1 to {high}. Guess it: reply with one number.",
             "answer": str(rng.randint(1, high))} for _ in range(n)]

    def last_guess(messages) -> int | None:
        text = messages[-1].content or ""
        digits = "".join(ch if ch.isdigit() else " " for ch in text).split()
        return int(digits[-1]) if digits else None

    class Guess(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            guess, target = last_guess(messages), int(state["answer"])
            if guess == target:
                state["final_env_response"] = [vf.UserMessage(content="Correct!")]
                return state["final_env_response"]
            hint = "Reply with one number." if guess is None else ("Higher." if guess < target else "Lower.")
            return [vf.UserMessage(content=hint)]

    def found(completion, answer) -> float:
        guesses = [m for m in completion if m.role == "assistant"]
        return 1.0 if guesses and last_guess(guesses) == int(answer) else 0.0

    return Guess(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[found]), max_turns=5)


def load_single_env(n: int = 30, seed: int = 0):
    """A ``vf.SingleTurnEnv`` with an ``XMLParser``: the answer goes in ``<answer>`` tags."""
    import verifiers as vf
    from datasets import Dataset

    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n)]
    rows = [{"question": f"Write the word '{w}' backwards.", "answer": w[::-1]} for w in words]
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def reversed_exactly(completion, answer) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows[: n // 3]),
                            parser=parser, rubric=vf.Rubric(funcs=[reversed_exactly], parser=parser),
                            system_prompt="Answer inside <answer></answer> tags.")


def gsm8k_rows(n: int = 30, seed: int = 0) -> list[dict]:
    """Rows as SkyRL's dataset scripts write them (``prompt``, ``env_class``, ``reward_spec``)."""
    return [{"prompt": [{"role": "user", "content": f"{row['question'].removesuffix(' Reply with the number only.')}"
                                                    " Give the final answer after '####'."}],
             "env_class": "gsm8k", "reward_spec": {"method": "rule", "ground_truth": row["answer"]},
             "extra_info": {"max_turns": 3}, "data_source": "times_plus"}
            for row in _problems(n, seed)]
