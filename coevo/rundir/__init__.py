"""The run directory: its records, checkpoints, lock, loop state and consistency check."""
