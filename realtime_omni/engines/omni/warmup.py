"""The end of an omni model's load: spoken turns prefilled alone and several at once, then the
load's heap frozen out of the garbage collector's full passes.

Capturing the graphs at load runs no real prefill: the first turns of users then paid what the
first uses of the prefill path cost once per process, on top of their own. Measured on the H200
(``benchmarks/omni_prefill_profile.py --cold-profile``, Qwen3-Omni-30B-A3B at random weights): the
first one-session prefill with audio took 0.95 s, the first batch of four sessions 2.4 s (against
0.12 s for the next batch, of eight); the capacity runs saw the same, about 1.7 s, at their first
level with batches of several rows, with both architectures, and not at the levels after it.
On CUDA, throw-away sessions prefill a short silent turn, one alone and then a few together through
the batched prefills, so those costs fall on the load (2026-12-05, H200, Qwen3: 1 in 686 ms, 2 in
2337 ms, 4 in 77 ms; the first level of 8 sessions then started its replies in 243 ms, against
3068 ms without).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..base import ThinkRequest, TurnMessage

#: sessions prefilling together in each warm-up round (capped by the model's slots)
SIZES = (1, 2, 4)
#: longest wait for one round (a slow first prefill on a large model takes a few seconds)
ROUND_TIMEOUT_S = 120.0


def _request() -> ThinkRequest:
    silence = np.zeros(16_000, dtype=np.int16)  # one second: the audio tower runs as for speech
    return ThinkRequest(instructions="", messages=[TurnMessage(role="user", text="hello", audio=silence)],
                        max_output_tokens=4, voice="", want_audio=True)


def warm_prefills(model: Any, sizes: Sequence[int] = SIZES,
                  progress: Callable[[str], None] = lambda _msg: None) -> list[int]:
    """Prefill a short spoken turn in throw-away sessions of ``model`` (an ``OmniModel``), ``n``
    at once for each ``n`` of ``sizes`` that its slots allow; returns the sizes run. A failure
    is reported and leaves the model as it was (the sessions it opened are closed)."""
    slots = model.max_sessions
    run = [n for n in sizes if n == 1 or (slots and n <= slots)]
    request = _request()
    took: list[str] = []
    for n in run:
        sessions = [model.open_session() for _ in range(n)]
        barrier = threading.Barrier(n)
        errors: list[BaseException] = []

        def prefill(session: Any) -> None:
            try:
                barrier.wait(timeout=ROUND_TIMEOUT_S)
                session.prefill(request)
            except BaseException as exc:  # noqa: BLE001 - reported below, on the loading thread
                errors.append(exc)

        began = time.perf_counter()
        threads = [threading.Thread(target=prefill, args=(s,), name=f"omni-warmup-{i}", daemon=True)
                   for i, s in enumerate(sessions)]
        try:
            for thread in threads:
                thread.start()
            deadline = began + ROUND_TIMEOUT_S
            for thread in threads:
                thread.join(max(0.0, deadline - time.perf_counter()))
        finally:
            for session in sessions:
                session.close()
        if errors or any(t.is_alive() for t in threads):
            problem = f"{type(errors[0]).__name__}: {errors[0]}" if errors else "timed out"
            progress(f"prefill warm-up stopped at {n} sessions ({problem})")
            return run[: run.index(n)]
        took.append(f"{n} in {1000 * (time.perf_counter() - began):.0f} ms")
    progress("prefills warmed up: " + ", ".join(took))
    return run


def freeze_heap(progress: Callable[[str], None] = lambda _msg: None) -> float:
    """Move every object alive after the load (modules, parameters, graphs, the libraries'
    own: about 400 000 objects) out of the garbage collector's sight (``gc.freeze``). A full
    collection scans them all while it holds the interpreter lock, which stops every stage's loop
    and every session's thread at once: 150-170 ms on the 2-core development machine for the
    tiny checkpoint's process. Returns the seconds the full collection before the freeze took."""
    began = time.perf_counter()
    gc.collect()
    took = time.perf_counter() - began
    gc.freeze()
    progress(f"heap frozen: {gc.get_freeze_count()} objects out of the collector's sight "
             f"(a full collection over them took {1000 * took:.0f} ms)")
    return took
