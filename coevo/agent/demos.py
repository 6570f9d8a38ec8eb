"""Where a request's demonstration turns sit in its prompt ids.

The few_shot processor marks the turns it inserts (``coevo.harness.events.DEMO``). After a batch is
generated, each request that holds marked turns is rendered again without them by the same policy;
when the ids without them are exactly the prompt ids with one contiguous span removed (chat
templates render turn by turn, so they are), that span is the demonstrations' and is recorded on
the call. A trainer can then train the reply under the prompt the harness would show without its
demonstrations (``coevo.trainers.batch.distilled``) without ever re-tokenising text: the ids are
the ones the policy rendered, now or at generation time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from coevo.agent.policy import ChatRequest, Generation, Policy
from coevo.harness.events import DEMO, Message


def without_demos(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if not m.get(DEMO)]


def without_nearest_demo(messages: Sequence[Message]) -> list[Message]:
    """``messages`` without the demonstration nearest the task: the marked turns from the last marked
    user turn on (every demonstration opens with its user turn). With one ``few_shot`` processor
    this is the prompt of ``coevo.harness.scaffold.with_one_demonstration_fewer``: the layer the
    retirement sheds next."""
    marked = [i for i, m in enumerate(messages) if m.get(DEMO)]
    opens = [i for i in marked if messages[i].get("role") == "user"]
    if not marked:
        return list(messages)
    first = opens[-1] if opens else marked[0]
    return [m for i, m in enumerate(messages) if not (m.get(DEMO) and i >= first)]


def cut_span(prompt_ids: Sequence[int], bare_ids: Sequence[int]) -> list[int] | None:
    """[start, end) such that ``prompt_ids[:start] + prompt_ids[end:] == bare_ids``, or None when no
    single cut gives ``bare_ids`` (or nothing would be cut)."""
    n, m = len(prompt_ids), len(bare_ids)
    if m >= n:
        return None
    start = 0
    while start < m and prompt_ids[start] == bare_ids[start]:
        start += 1
    end = n - (m - start)
    return [start, end] if list(prompt_ids[end:]) == list(bare_ids[start:]) else None


def with_demo_spans(policy: Policy, requests: Sequence[ChatRequest],
                    generations: list[Generation | BaseException]) -> list[Generation | BaseException]:
    """``generations`` with ``demo_span`` (every demonstration) and ``nearest_demo_span`` (the one
    nearest the task) set where the request held demonstration turns and the policy renders prompts
    (``prompt_ids``; a scripted policy does not)."""
    out = []
    for request, gen in zip(requests, generations, strict=True):
        if isinstance(gen, Generation) and any(m.get(DEMO) for m in request.messages):
            bare = policy.prompt_ids(without_demos(request.messages), request.reply_prefix)
            fewer = policy.prompt_ids(without_nearest_demo(request.messages), request.reply_prefix)
            if bare is None or fewer is None:  # a policy that renders no prompt: no spans to find
                return generations
            gen = dataclasses.replace(gen, demo_span=cut_span(gen.prompt_ids, bare),
                                      nearest_demo_span=cut_span(gen.prompt_ids, fewer))
        out.append(gen)
    return out
