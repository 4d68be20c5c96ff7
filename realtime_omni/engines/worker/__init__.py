"""Fault isolation: a model engine in a supervised worker process.

``IsolatedModel(name)`` is a :class:`~realtime_omni.engines.base.VoiceModel` that runs the
registry builder ``name`` in a child process ("spawn"), proxies every session call over one pipe,
and restarts the child when it dies (pending calls raise :class:`WorkerCrashed`).
"""

from .protocol import WorkerClosed, WorkerCrashed, WorkerError, WorkerTimeout, WorkerUnavailable
from .proxy import IsolatedModel, IsolatedSession, IsolatedVADSession
from .remote import RemoteSession, RemoteVADStream

__all__ = [
    "IsolatedModel",
    "IsolatedSession",
    "IsolatedVADSession",
    "RemoteSession",
    "RemoteVADStream",
    "WorkerClosed",
    "WorkerCrashed",
    "WorkerError",
    "WorkerTimeout",
    "WorkerUnavailable",
]
