"""Cross-session batching for the omni engine: one step loop per stage serves every session.

* ``slots.py``: the stage's KV cache with a slot (batch row) per session, and the per-row cache
  view the batched step attends through;
* ``mailbox.py``: requests from session threads to one loop thread, with deadlines;
* ``batcher.py``: the loop that gathers the pending step of every session into one forward pass
  (CUDA graph per batch-size bucket);
* ``prefill.py``, ``prefill_graphs.py``: the thinker's and talker's prefills of several sessions as
  one padded forward, replayed as a CUDA graph per (rows, tokens, columns) bucket;
* ``rows.py``: what a session holds of each stage (:class:`~.rows.SessionRows`);
* ``stages.py``: the thinker, talker and Qwen3 code-predictor steps over rows, and
  :class:`OmniBatching`, which owns them for one loaded model.
"""

from .batcher import Activity, Lookahead, RowInput, StepBatcher
from .mailbox import BatcherClosed
from .slots import SlotPool, SlotsFull
from .stages import OmniBatching, SessionRows

__all__ = ["Activity", "BatcherClosed", "Lookahead", "OmniBatching", "RowInput", "SessionRows", "SlotPool", "SlotsFull",
           "StepBatcher"]
