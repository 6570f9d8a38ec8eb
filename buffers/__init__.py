"""coevo.buffers: the disk-backed replay buffer of traces with cached behaviour log-probs.

Installed as ``coevo.buffers`` (see pyproject's package-dir). The buffer arrives with the GRPO
work (DESIGN §6); this package currently holds no code.
"""
