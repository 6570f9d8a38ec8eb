"""Small OpenEnv environments built locally (no docker, no Hugging Face Space), run by ``env=openenv``."""
