"""The typed configuration: the schema Hydra composes, its reference, import paths and optional dependencies."""
