"""Local verifiers 0.4 (``verifiers.v1``) tasksets, run offline by ``env=verifiers`` (docs/environments.md)."""
