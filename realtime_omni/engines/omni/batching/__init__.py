"""Cross-session batching for the omni engine: one step loop per stage serves every session.

* ``slots.py``: the stage's KV cache with a slot (batch row) per session, and the per-row cache
  view the batched step attends through;
* ``batcher.py``: the loop that gathers the pending step of every session into one forward pass
  (CUDA graph per batch-size bucket);
* ``rows.py``: what a session holds of each stage (:class:`~.rows.SessionRows`);
* ``stages.py``: the thinker, talker and Qwen3 code-predictor steps over rows, and
  :class:`OmniBatching`, which owns them for one loaded model.
"""

from .batcher import Activity, BatcherClosed, Lookahead, RowInput, StepBatcher
from .slots import SlotPool, SlotsFull
from .stages import OmniBatching, SessionRows

__all__ = ["Activity", "BatcherClosed", "Lookahead", "OmniBatching", "RowInput", "SessionRows", "SlotPool", "SlotsFull",
           "StepBatcher"]
