"""coevo.trainers: cross-harness GRPO (advantages by task group, loss aggregation, the update step).

Installed as ``coevo.trainers`` (see pyproject's package-dir). The algorithms arrive with the
replay-buffer and GRPO work (DESIGN §6); this package currently holds no code.
"""
