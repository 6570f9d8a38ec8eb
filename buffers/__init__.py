"""coevo.buffers: the disk-backed replay buffer of traces with cached behaviour log-probs.

Installed as ``coevo.buffers`` (see pyproject's package-dir). Rounds insert their traces with the
current model's log-probs (``ReplayBuffer.add``); cross-harness GRPO reads them back grouped by
task id, batch by batch, and the buffer survives the training process being killed at any time.
"""

from .codec import decode_trace, encode_trace
from .entry import BufferEntry, LogprobFn, LogprobQuery
from .replay import ReplayBuffer
from .segments import CorruptSegmentError
from .store import CorruptBufferError

__all__ = [
    "BufferEntry",
    "CorruptBufferError",
    "CorruptSegmentError",
    "LogprobFn",
    "LogprobQuery",
    "ReplayBuffer",
    "decode_trace",
    "encode_trace",
]
