"""The messages between the server process and a model worker process, and the worker's errors.

Every message is a tuple whose first element is an ``int`` op code (cheap to pickle). Whatever an
engine produces or consumes (numpy arrays, dataclasses, exceptions) travels as a separately
pickled ``bytes`` blob inside the tuple, so a payload that fails to unpickle fails only its own
call, never the channel.

Server → worker::

    (CALL,   call_id, session_key, method, blob(args))       one reply: RESULT or ERROR
    (STREAM, call_id, session_key, method, blob(args), window)  ITEM* then END or ERROR
    (CANCEL, call_id)                 sets the call's cancel Event (streams stop at the next step)
    (CREDIT, call_id, n)              the consumer took n more items: the producer may send n more
    (OPEN,   session_key)             open the session now (fire and forget; calls open lazily too)
    (PING,   call_id)                 answered at once by the worker's reader thread (RESULT None)
    (SHUTDOWN,)                       exit now

Worker → server::

    (PROGRESS, text)                  a load step (forwarded to the ``load`` progress callback)
    (READY, blob(ModelInfo), Traits, pid)
    (LOAD_FAILED, traceback_text)
    (RESULT, call_id, blob(value))
    (ITEM,   call_id, blob(value))
    (END,    call_id)
    (ERROR,  call_id, blob(exception), traceback_text)
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

CALL, STREAM, CANCEL, CREDIT, OPEN, PING, SHUTDOWN = 1, 2, 3, 4, 5, 6, 7
PROGRESS, READY, LOAD_FAILED, RESULT, ITEM, END, ERROR = 20, 21, 22, 23, 24, 25, 26

#: ``session_key`` for calls that belong to no session (ping)
NO_SESSION = 0

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def wire_request(request: Any, strip_audio: bool) -> Any:
    """A ``ThinkRequest`` as it travels to a worker (a local process or a Ray actor): without its
    cancel Event (the worker keeps its own), and without the user's audio when the engine would
    not hear it anyway (``strip_audio``: less to pickle per turn)."""
    import copy
    import dataclasses

    wire = copy.copy(request)
    wire.cancelled = None
    if strip_audio:
        wire.messages = [dataclasses.replace(m, audio=None) if m.audio is not None else m for m in request.messages]
    return wire


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, _PROTOCOL)


loads = pickle.loads


@dataclass(frozen=True)
class Traits:
    """What the server needs to know about the worker's ``ModelSession`` class without calling it.

    Some session methods are called on the event loop (``new_vad`` when a session starts,
    ``talk_boundary`` per thinker chunk) or only decide which class a session is (the session
    manager's ``_has_vad`` looks at ``type(session).new_vad``), so the proxy must answer them
    locally: it knows from these flags whether the engine keeps the base implementation.
    """

    has_vad: bool
    custom_talk_boundary: bool
    custom_decode: bool
    vad_frame_samples: int = 512
    talks_every_output: bool = False
    talks_live: bool = False


class WorkerError(RuntimeError):
    """Base class of the failures that come from running the model in another process."""


class WorkerCrashed(WorkerError):
    """The worker process died while this call was in flight (its state died with it)."""


class WorkerUnavailable(WorkerError):
    """No worker came up in time (restart still loading, or failing to load)."""


class WorkerClosed(WorkerUnavailable):
    """The isolated model was closed."""


class WorkerTimeout(WorkerError):
    """The worker did not answer a call within its deadline (a hung engine call): the caller
    stops waiting; a late answer is dropped."""


class RemoteError(Exception):
    """An engine exception that could not travel as itself (not picklable)."""


class RemoteTraceback(Exception):
    """Carries the worker-side traceback text; set as ``__cause__`` of re-raised engine errors."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def pack_exception(exc: BaseException) -> bytes:
    """The exception itself when it survives a pickle round trip, else a :class:`RemoteError`."""
    try:
        blob = dumps(exc)
        loads(blob)
        return blob
    except Exception:  # noqa: BLE001 - any pickling failure: send a plain description instead
        return dumps(RemoteError(f"{type(exc).__name__}: {exc}"))


def unpack_exception(blob: bytes, tb: str) -> BaseException:
    try:
        exc = loads(blob)
    except Exception as err:  # noqa: BLE001
        exc = RemoteError(f"undecodable worker error ({err})")
    if not isinstance(exc, BaseException):
        exc = RemoteError(repr(exc))
    exc.__cause__ = RemoteTraceback(tb)
    return exc
