"""The smallest agent program: one chat-completions request (system prompt, task), its reply printed.

What verifiers' ``null`` harness program does for a single-turn task, written with the OpenAI SDK
against whatever ``OPENAI_BASE_URL`` names; ``CHAT_SYSTEM_PROMPT`` sets the system prompt.
"""

from __future__ import annotations

import os
import sys

from openai import OpenAI


def main() -> None:
    messages = [{"role": "user", "content": sys.stdin.read()}]
    if os.environ.get("CHAT_SYSTEM_PROMPT"):
        messages.insert(0, {"role": "system", "content": os.environ["CHAT_SYSTEM_PROMPT"]})
    reply = OpenAI().chat.completions.create(model="coevo", messages=messages).choices[0].message.content or ""
    print(reply.replace("\n", " "))


if __name__ == "__main__":
    main()
