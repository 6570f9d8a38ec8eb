"""coevo.kernels: GRPO loss kernels that never hold the full [tokens × vocab] logits.

Installed as ``coevo.kernels`` (see pyproject's package-dir). The reference, chunked and Triton
paths arrive with the GRPO work (DESIGN §6); this package currently holds no code.
"""
