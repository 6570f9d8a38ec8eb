"""What keeps secrets and model-written code contained: secret redaction and refusal, the python tool's jail."""
