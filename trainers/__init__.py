"""coevo.trainers: cross-harness GRPO (advantages by task group, training rows, the update step,
FSDP2 sharding).

Installed as ``coevo.trainers`` (see pyproject's package-dir).
"""
