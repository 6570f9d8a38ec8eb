"""Running code the project did not write: processor source from the meta-agent, and the agent's
``python`` tool.

``restricted`` loads processor source under a static policy and runs it in a forked, time- and
memory-limited child; ``python_tool`` runs free-form agent code in an isolated interpreter
subprocess with resource limits. Neither is an OS-level jail (same user, same filesystem and
network): the policy and the limits guard against mistakes and casual escapes, not against a
determined attacker with a kernel or interpreter bug.
"""

from coevo.sandbox.python_tool import PythonResult, run_python
from coevo.sandbox.restricted import (
    ALLOWED_MODULES,
    SandboxError,
    SandboxMemoryError,
    SandboxRefusal,
    SandboxTimeout,
    call_in_sandbox,
    check_source,
)

__all__ = [
    "ALLOWED_MODULES",
    "PythonResult",
    "SandboxError",
    "SandboxMemoryError",
    "SandboxRefusal",
    "SandboxTimeout",
    "call_in_sandbox",
    "check_source",
    "run_python",
]
