"""Policies: transformers (CPU/GPU), vLLM (GPU), the embedded SmolLM2 model, tiny test models."""
