"""Skill documents for the skills axis: one short procedural note per ``skill:<dataset>``.

A note says how to solve a kind of task, never what any task's answer is: it is written from the
dataset's name and its curated description in ``coevo.envs.reasoning`` (which tool a gold solution
uses; not the answer format, whose examples could be answers), and it holds no digits at all, so no
numeric answer can hide in it.
EvoHarnessBench mines its skills from source system prompts (§3.3); reasoning-gym has none, so
the procedures below are hand-written, one per curated dataset, with a generic note from the
name for any other dataset.
"""

from __future__ import annotations

import re

from coevo.envs.reasoning import CURATED

PROCEDURES: dict[str, str] = {
    "basic_arithmetic": ("Evaluate the expression with the usual precedence: multiplication before addition and "
                         "subtraction, otherwise left to right. Give the whole expression to a tool in one call."),
    "chain_sum": "Add and subtract the terms from left to right; give the whole chain to a tool in one call.",
    "letter_counting": ("Copy the quoted words exactly, lower-case them and count the target letter with a short "
                        "program such as text.lower().count(letter); counting by eye misses repeats."),
    "leg_counting": ("Multiply each animal's count by its number of legs (birds two, most mammals four, insects "
                     "six, spiders eight) and add the products in one expression."),
    "products": "Multiply the numbers with a tool rather than by hand; keep every digit of the result.",
    "number_sequence": ("Find the rule: look at the differences between neighbours, then differences of "
                        "differences, then ratios; check the rule on every given term before extending it once."),
    "simple_equations": ("Move the terms with the variable to one side and the constants to the other, divide by "
                         "the coefficient, then substitute the value back to check it."),
    "family_relationships": ("Draw the family as marriages and parent-child links, follow the path from the first "
                             "person to the second and name the relation; a spouse's parent is a parent-in-law."),
    "gsm_symbolic": ("List the quantities in the story, write one expression that combines them as the question "
                     "asks, evaluate it with a tool and answer with the number alone, without units."),
    "mini_sudoku": ("Every row, column and two-by-two box holds each number once. Fill cells with a single "
                    "candidate first; if none is left, search with a short backtracking program."),
}

_DIGIT = re.compile(r"\d")


def skill_document(name: str) -> str:
    """The procedural note of skill ``name`` (a dataset name). Raises ValueError if a note would
    contain a digit, the one way an answer could leak into it."""
    if not name:
        raise ValueError("a skill needs a non-empty name")
    words = name.replace("_", " ")
    body = PROCEDURES.get(name, f"Read the {words} task carefully, work out what is asked, solve it step by step "
                                "and check the result against the question before answering.")
    spec = CURATED.get(name)
    if spec is not None:
        body += f" The {spec.tool} tool helps." if spec.tool else " No tool is needed."
    note = f"How to solve {words} tasks: {body}"
    if _DIGIT.search(note):
        raise ValueError(f"skill note for {name!r} contains a digit; notes must not be able to carry answers")
    return note
