"""Harness streams (EvoHarnessBench): capabilities released stage by stage along an axis, evaluated
under the deployment and self-evolving protocols against a task-specific reference (FWT/BWT).

``construct`` builds a stream from annotated tasks, ``axes`` turns a stage's capabilities into a
harness, ``protocols`` run the systems, ``metrics`` are the pure formulas, ``run`` ties them
together and writes the results.
"""

from coevo.streams.axes import AXES, exposed_tools, skills_harness, tools_harness, with_agent_capabilities
from coevo.streams.construct import Stream, StreamError, build_stream, check_stream
from coevo.streams.metrics import backward_transfer, forward_transfer, pass_matrix
from coevo.streams.outcomes import Outcome, ProtocolResult
from coevo.streams.protocols import PROTOCOLS, deployment, self_evolving, task_specific_reference
from coevo.streams.run import StreamRun, run_stream

__all__ = [
    "AXES",
    "PROTOCOLS",
    "Outcome",
    "ProtocolResult",
    "Stream",
    "StreamError",
    "StreamRun",
    "backward_transfer",
    "build_stream",
    "check_stream",
    "deployment",
    "exposed_tools",
    "forward_transfer",
    "pass_matrix",
    "run_stream",
    "self_evolving",
    "skills_harness",
    "task_specific_reference",
    "tools_harness",
    "with_agent_capabilities",
]
