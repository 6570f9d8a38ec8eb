"""coevo: harness-model co-evolution for LLM agents."""

__version__ = "0.1.0"
