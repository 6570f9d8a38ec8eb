"""Running code the project did not write: processor source from the meta-agent, and the agent's
``python`` tool.

``source_policy`` checks processor source against a static policy and ``child_runner`` runs it in
a forked, time- and memory-limited child; ``python_tool`` runs free-form agent code in an
isolated interpreter subprocess with resource limits. Neither is an OS-level jail (same user, same
filesystem and network): the policy and the limits guard against mistakes and casual escapes, not against a
determined attacker with a kernel or interpreter bug.
"""

from coevo.sandbox.child_runner import SandboxError, SandboxMemoryError, SandboxTimeout, call_in_sandbox
from coevo.sandbox.python_tool import PythonResult, run_python
from coevo.sandbox.source_policy import ALLOWED_MODULES, SandboxRefusal, check_source

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
