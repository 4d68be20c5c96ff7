"""One reply's codec stream: code chunks in, the new samples out (see :mod:`.codec` for how
windows reach back for left context, hold back their last codes and cross-fade the seams)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .codec import OUTPUT_RATE, OmniCodec, PendingWindow

log = logging.getLogger(__name__)


#: windows a stream has at the codec at once: the one its reader waits for and the next (a pass
#: takes one window of each reply, so a third would only wait in the queue)
IN_FLIGHT = 2


@dataclass(eq=False)
class _Sent:
    """A window sent to the codec: which samples of its render are new."""

    ref: Any  # what the caller named it by (a chunk), or None
    window: PendingWindow | None  # None: nothing new to render
    base: int = 0  # global index of the render's first sample
    first: int = 0  # of the new samples, and one past the last
    last: int = 0
    final: bool = False
    #: frames were lost upstream before this window: no cross-fade with the last one
    fresh: bool = False


class CodecStream:
    """Incremental decoder for one reply: push code chunks in order, get the new samples.

    :meth:`push` is :meth:`send` then :meth:`receive`. A caller that knows a chunk early (the
    talker's thread, as the chunk is made) sends it then, and the thread that plays the audio
    receives it later: the codec decodes the window meanwhile, in the pass after the one running
    (at most :data:`IN_FLIGHT` windows at once; chunks sent beyond that wait here and go as
    windows come back). Sending is thread-safe against receiving; each is called from one thread."""

    @classmethod
    def of(cls, codec: OmniCodec, turn: int, speaker: str | None, seed: int | None = None,
           slot: int | None = None) -> CodecStream:
        """A stream of ``codec`` for one reply (``seed``: the codec's own by default; ``slot``: the
        session's talker slot, which names the reply's first window to the batched codec)."""
        return cls(codec, turn, speaker, codec.settings.seed if seed is None else seed, slot)

    def __init__(self, codec: OmniCodec, turn: int, speaker: str | None, seed: int, slot: int | None = None) -> None:
        self.codec = codec
        self.slot = slot
        self.turn = turn
        self.speaker = speaker
        self.seed = seed
        # sending: the codes so far and how far windows reach
        self.codes: list[Any] = []  # per-chunk tensors
        self.n = 0  # codes received
        self.emitted = 0  # samples sent for (global index of the next sample)
        self.finished = False  # the last window was made
        self.complete = False  # the last chunk was sent (its window may wait its turn)
        self._sent_first = False
        self._sent: collections.deque[_Sent] = collections.deque()
        self._later: collections.deque[tuple[Any, Any, int | None, bool]] = collections.deque()
        self._lock = threading.Lock()
        # receiving
        self.tail: np.ndarray | None = None  # previous render of the held-back samples
        self.started: float | None = None  # when the first audio came out (the listener starts)

    def push(self, codes, start: int | None = None, final: bool = False) -> np.ndarray:
        ref = object()
        self.send(codes, start, final, ref)
        return self.receive(ref)

    def send(self, codes, start: int | None = None, final: bool = False, ref: Any = None) -> None:
        """Take a chunk of codes (``start``: its first code's index in the reply) and send the
        window it completes, or keep it until fewer windows are in flight. ``ref`` names it for
        :meth:`receive`."""
        import torch

        codes = torch.as_tensor(codes, dtype=torch.long).cpu()
        with self._lock:
            self.complete = self.complete or final
            self._later.append((ref, codes, start, final))
            self._pump()

    def sent(self, ref: Any) -> bool:
        """Whether a chunk named ``ref`` was sent and not yet received."""
        with self._lock:
            return self._holds(ref)

    def receive(self, ref: Any = None) -> np.ndarray:
        """The new samples of the chunk named ``ref`` (None, or a name never sent: the oldest sent).
        Chunks sent before it and not received are skipped: their windows are dropped and their
        samples lost."""
        with self._lock:
            known = ref is not None and self._holds(ref)
            while known and not (self._sent and self._sent[0].ref is ref):
                if self._sent:
                    self._drop_oldest()
                else:
                    self._sent.append(self._window(*self._later.popleft()))
            if not self._sent and self._later:
                self._sent.append(self._window(*self._later.popleft()))
            if not self._sent:
                return np.zeros(0, np.float32)
            sent = self._sent[0]
        try:
            return self._samples(sent)
        finally:
            with self._lock:
                if self._sent and self._sent[0] is sent:
                    self._sent.popleft()
                self._pump()

    def cancel(self) -> None:
        """The reply was cut: drop what is still queued at the codec."""
        with self._lock:
            self._later.clear()
            while self._sent:
                sent = self._sent.pop()
                if sent.window is not None:
                    sent.window.cancel()

    # sending ------------------------------------------------------------------------------------

    def _holds(self, ref: Any) -> bool:
        """Under ``_lock``: a chunk named ``ref`` is out at the codec or kept for later."""
        return any(s.ref is ref for s in self._sent) or any(item[0] is ref for item in self._later)

    def _pump(self) -> None:
        """Under ``_lock``: send kept chunks while fewer than :data:`IN_FLIGHT` are out."""
        while self._later and len(self._sent) < IN_FLIGHT:
            self._sent.append(self._window(*self._later.popleft()))

    def _drop_oldest(self) -> None:
        """Under ``_lock``, in the reading thread: drop the oldest sent window unread; the next
        one read starts afresh (no cross-fade with samples nobody heard)."""
        sent = self._sent.popleft()
        if sent.window is not None:
            sent.window.cancel()
        self.tail = None

    def _window(self, ref: Any, codes, start: int | None, final: bool) -> _Sent:
        import torch

        fresh = False
        if start is not None and start != self.n:
            if start < self.n:  # a replay: forget what follows
                self._truncate(start)
            else:  # frames were lost upstream: continue without them (no left context there)
                log.debug("omni codec: gap of %d frames", start - self.n)
                self.codes.append(torch.zeros((start - self.n, *codes.shape[1:]), dtype=torch.long))
                self.n = start
                self.emitted = max(self.emitted, self.codec.rendered_length(start))
                fresh = True
        if codes.shape[0]:
            self.codes.append(codes)
            self.n += int(codes.shape[0])
        return self._emit(ref, final, fresh)

    def _truncate(self, n: int) -> None:
        import torch

        allc = torch.cat(self.codes, dim=0) if self.codes else None
        self.codes = [allc[:n]] if allc is not None else []
        self.n = n

    def _emit(self, ref: Any, final: bool, fresh: bool) -> _Sent:
        import torch

        codec = self.codec
        U = codec.samples_per_code
        hold = 0 if final else max(0, codec.settings.lookahead_frames)
        target = codec.rendered_length(max(0, self.n - hold)) if self.n - hold > 0 else 0
        if final:
            target = codec.rendered_length(self.n)
            self.finished = True
        if target <= self.emitted or self.n == 0:
            return _Sent(ref, None, final=final, fresh=fresh)
        first_code = self.emitted // U
        c0 = max(0, first_code - max(0, codec.settings.left_context_frames))
        c0 = (c0 // codec.block) * codec.block
        if final:
            c0 = codec.last_start(self.n, c0)
        allc = torch.cat(self.codes, dim=0)
        if len(self.codes) > 1:
            self.codes = [allc]
        owner = None if self._sent_first else self.slot
        self._sent_first = True
        window = codec.begin(allc[c0 : self.n], c0, self.speaker, self.seed, steady=not final,
                             deadline=self._deadline(), owner=owner, reply=self)
        sent = _Sent(ref, window, base=c0 * U, first=self.emitted, last=target, final=final, fresh=fresh)
        self.emitted = target
        return sent

    def _deadline(self) -> float:
        """When a listener who plays from the first audio reaches the next sample to send (the
        first window, or one sent before the first audio came out: from now)."""
        start = self.started if self.started is not None else time.monotonic()
        return start + self.emitted / OUTPUT_RATE

    # receiving ----------------------------------------------------------------------------------

    def _samples(self, sent: _Sent) -> np.ndarray:
        if sent.fresh:
            self.tail = None
        if sent.window is None:
            return np.zeros(0, np.float32)
        wav = sent.window.wait()
        new = wav[sent.first - sent.base : sent.last - sent.base].copy()
        if self.tail is not None and len(self.tail) and len(new):
            xf = min(len(self.tail), len(new), int(self.codec.settings.crossfade_ms * OUTPUT_RATE / 1000))
            if xf > 0:
                w = (np.arange(1, xf + 1, dtype=np.float32) / (xf + 1))
                new[:xf] = self.tail[:xf] * (1.0 - w) + new[:xf] * w
        self.tail = wav[sent.last - sent.base :].copy() if not sent.final else None
        if self.started is None and len(new):
            self.started = time.monotonic()
        return new


def to_int16(wav: np.ndarray) -> np.ndarray:
    return (np.clip(wav, -1.0, 1.0) * 32767.0).round().astype(np.int16)
