"""The co-evolution loop: from a config to rounds of rollout, AEGIS and GRPO."""
