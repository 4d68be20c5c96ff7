"""How many sessions the batched stages keep in real time, from step times measured at load.

The model of a second of speech, with ``B`` sessions all speaking at once and every reply still
being written (the capacity run's load: every reply asked together):

* the talker runs one frame step for all ``B`` rows per code frame (``frame_s`` of audio: 80 ms
  for Qwen3, 20 ms for Qwen2.5), so ``talker(B) / frame_s`` of device time per second;
* the thinker runs ``tokens_per_frame`` steps per frame while the replies are being written
  (Qwen3: one text token per frame; Qwen2.5: one per three codes), ``thinker(B) *
  tokens_per_frame / frame_s``;
* the codec decodes every session's running window once per window (``window_s`` of new audio),
  all of them together in groups of the captured buckets, as when the replies started together
  (replies that started apart form smaller groups, which cost more per window):
  ``codec(group sizes) / window_s``.

The stages run on their own streams but share the GPU, so their demands add up. ``B`` sessions
are in real time when the sum stays within ``budget`` of each second; the rest is left to the
prefills of new turns and to the moments when all replies start at once. The largest such ``B``
(at most the slots) is the engine's real-time capacity; admission refuses sessions beyond it
(``engines.omni.realtime_admission``). A step's time is that of the smallest bucket holding its
rows: what the loop runs.

The host counts too: each session's own threads walk its reply token by token and frame by frame
under the one interpreter lock all sessions share (Qwen3 on the H200: about 1.2 ms per session and
frame at N = 8, 32 and 64, ``session_cpu_s`` in docs/benchmarks), which binds before the device
does at about 64 sessions. So the load also times one throw-away reply's own threads, per frame,
and the capacity keeps ``sessions * host / frame_s`` within the same budget of the interpreter.
The runs record it as ``capacity_estimate``. Against them it errs low: Qwen2.5 on the H100
(docs/benchmarks/omni-qwen25-realtime.md) was estimated at 8 sessions at the default budget and
kept 16 in real time, because the stages' device times are added here where their streams
overlap on the GPU (a budget of 0.7 admits those 16 and not 20).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: thinker steps per talker frame while replies are written: Qwen3's talker reads one text token
#: per 80 ms frame; Qwen2.5 speaks about three 20 ms codes per token (the capacity runs' replies)
TOKENS_PER_FRAME: dict[str, float] = {"qwen3_omni_moe": 1.0, "qwen2_5_omni": 1 / 3}


@dataclass(frozen=True)
class StepTimes:
    """Milliseconds per step by rows (the buckets measured), per stage. The decode steps are
    timed attending over about 1024 columns of context (longer contexts cost a little more)."""

    thinker: Mapping[int, float]
    talker: Mapping[int, float]
    #: one group of that many steady codec windows
    codec: Mapping[int, float] = field(default_factory=dict)
    #: the interpreter's milliseconds one session's own threads take per frame (0: not measured)
    host: float = 0.0


@dataclass(frozen=True)
class Workload:
    """What one real-time second of one session asks of the stages."""

    frame_s: float
    tokens_per_frame: float
    window_s: float
    #: share of each second the steady demand may take (the rest: prefills, bursts)
    budget: float = 0.6


def at(times: Mapping[int, float], rows: int) -> float:
    """A step's milliseconds for ``rows`` rows: the smallest measured bucket holding them
    (beyond the largest: that one's, in as many steps as needed)."""
    if rows <= 0 or not times:
        return 0.0
    sizes = sorted(times)
    fit = next((b for b in sizes if b >= rows), None)
    if fit is not None:
        return times[fit]
    top = sizes[-1]
    full, rest = divmod(rows, top)
    return full * times[top] + at(times, rest)


def demand(times: StepTimes, work: Workload, sessions: int) -> float:
    """Device seconds per wall second that ``sessions`` sessions speaking at once ask for."""
    per_frame = at(times.talker, sessions) + work.tokens_per_frame * at(times.thinker, sessions)
    codec = at(times.codec, sessions) / work.window_s if times.codec else 0.0
    return (per_frame / work.frame_s + codec) / 1000.0


def host_demand(times: StepTimes, work: Workload, sessions: int) -> float:
    """Interpreter seconds per wall second that ``sessions`` sessions' own threads ask for."""
    return sessions * times.host / (1000.0 * work.frame_s)


def realtime_sessions(times: StepTimes, work: Workload, slots: int) -> int:
    """The most sessions (up to ``slots``) whose demand, of the device and of the host, stays
    within the budget."""
    best = 0
    for n in range(1, slots + 1):
        if demand(times, work, n) > work.budget or host_demand(times, work, n) > work.budget:
            break
        best = n
    return best


def _timed(run: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    """Median milliseconds of ``run`` after one warm-up call."""
    run()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        samples.append(1000 * (time.perf_counter() - start))
    return statistics.median(samples)


def _distinct(inputs: tuple[Any, ...], vocab: int) -> None:
    """Each row its own inputs (token ids, embeddings, draws), so a mixture-of-experts step routes
    its rows to as many experts as a batch of real sessions does, not all to the same few."""
    import torch

    for tensor in inputs:
        if tensor.dtype.is_floating_point:
            tensor.uniform_(0.0, 1.0)
        elif tensor.dtype == torch.bool:
            tensor.fill_(False)  # (the thinker's "chain": forward the given token)
        else:
            tensor.random_(0, max(2, min(vocab, 1000)))  # token ids, positions


def measure(batching: Any, codec: Any, window_codes: int, repeats: int = 5) -> StepTimes:
    """Time each decode stage's step at every batch bucket, and the codec's steady window in
    groups, while no session speaks (every row is idle and writes to the scratch column only, so
    the slots' state, and an idle session's context, are untouched)."""
    import torch

    from ..streams import on_stream

    loaded = batching.loaded
    cuda = loaded.device_type == "cuda"
    vocab = int(loaded.thinker.lm_head.weight.shape[0])

    def stage(batcher: Any) -> dict[int, float]:
        columns = next((c for c in batcher.column_buckets if c > min(1023, batcher.scratch - 1)),
                       batcher.column_buckets[-1])
        sync = batcher.stream.synchronize if cuda and batcher.stream is not None else (lambda: None)
        out = {}
        for size in batcher.sizes:
            bucket = batcher._bucket(size, columns)
            with torch.inference_mode(), on_stream(batcher.stream):
                _distinct(bucket.inputs, vocab)

            def step(bucket: Any = bucket) -> None:
                with torch.inference_mode(), on_stream(batcher.stream), batcher.state_lock:
                    bucket.write_pos.fill_(batcher.scratch)  # every row idle: nothing kept changes
                    bucket.graph()

            out[size] = _timed(step, sync, repeats)
        return out

    times = {"thinker": stage(batching.thinker), "talker": stage(batching.talker)}
    groups: dict[int, float] = {}
    if codec is not None and codec.batcher is not None:
        stream = loaded.stream("codec")
        sync = stream.synchronize if cuda and stream is not None else (lambda: None)
        for size in (1, *codec.batcher.buckets):
            if size > batching.slots:
                break
            key, fn, inputs = codec.steady_window(size, window_codes)

            def window(key: Any = key if size == 1 else (key, size), fn: Any = fn, inputs: Any = inputs) -> None:
                with torch.inference_mode(), on_stream(stream):
                    codec.windows.run(key, fn, inputs, capture=False)

            groups[size] = _timed(window, sync, repeats)
    return StepTimes(times["thinker"], times["talker"], groups)


def _timed_items(items: Iterator[Any]) -> Iterator[tuple[Any, float]]:
    """Each item of ``items`` with this thread's CPU seconds it took."""
    while True:
        began = time.thread_time()
        try:
            item = next(items)
        except StopIteration:
            return
        yield item, time.thread_time() - began


def host_ms_per_frame(model: Any, tokens_per_frame: float, frames: int = 48) -> float | None:
    """The interpreter's milliseconds one session's own threads take per code frame of a reply,
    steady: a throw-away session of ``model`` (an ``OmniModel``) answers a second of silence
    with about ``frames`` frames, its stages one after the other in this thread (so every
    second counted is its own), each stage's first output left out (the prefill, the talker's
    prompt, the first window: once per reply). None when the reply was too short to tell, or no
    slot was free."""
    from ...base import ModelAtCapacity, ThinkRequest, TurnMessage
    from ..talker_stream import CodeChunk

    tokens = max(8, round(frames * tokens_per_frame))
    request = ThinkRequest(instructions="", max_output_tokens=tokens, voice="", want_audio=True,
                           messages=[TurnMessage(role="user", text="Tell me about your day.",
                                                 audio=np.zeros(16_000, dtype=np.int16))])
    try:
        session = model.open_session()
    except ModelAtCapacity:  # (measured again while every slot is taken)
        return None
    try:
        outputs, think_s = [], 0.0
        for i, (out, seconds) in enumerate(_timed_items(session.think(request))):
            outputs.append(out)
            think_s += seconds if i else 0.0
        spoken, talk_s = [], 0.0
        for i, (out, seconds) in enumerate(_timed_items(session.talk(outputs, "", threading.Event(), True))):
            spoken.append(out)
            talk_s += seconds if i else 0.0
        codec_s = 0.0
        for i, out in enumerate(spoken):
            began = time.thread_time()
            session.decode(out)
            codec_s += time.thread_time() - began if i else 0.0
    finally:
        session.close()
    steady = sum(len(out.codes.codes) for out in spoken[1:] if isinstance(out.codes, CodeChunk))
    if len(outputs) < 4 or steady < 8:
        return None
    per_token = think_s / (len(outputs) - 1)
    return 1000.0 * (tokens_per_frame * per_token + (talk_s + codec_s) / steady)


def estimate(model: Any, budget: float) -> tuple[int, StepTimes, str]:
    """An :class:`~..model.OmniModel`'s real-time capacity (with its slots as the ceiling), the
    step times it rests on, and the line that says so."""
    batching, codec, loaded = model.batching, model.codec, model.loaded
    if batching is None or loaded is None:
        raise RuntimeError("the real-time capacity is that of the batched stages (max_sessions > 0, loaded)")
    sizes = [model.first_chunk_frames, *model.ramp_frames]
    window = codec.running_window(sizes, model.chunk_frames) if codec is not None else 0
    times = measure(batching, codec, window, repeats=5 if loaded.device_type == "cuda" else 2)
    if codec is not None and getattr(codec.batcher, "mixer", None) is not None:
        codec.batcher.mixer.learn(times.codec, window)  # what a codec pass of mixed lengths costs
    frame_s = (codec.samples_per_code if codec is not None else 1920) / model.info.output_rate
    work = Workload(frame_s=frame_s, tokens_per_frame=TOKENS_PER_FRAME[model.arch],
                    window_s=model.chunk_frames * frame_s, budget=budget)
    try:
        host = host_ms_per_frame(model, work.tokens_per_frame)
    except Exception:  # noqa: BLE001 - a measurement must not keep the model from serving
        log.warning("omni: the host's share per session could not be measured; admitting by the device alone",
                    exc_info=True)
        host = None
    if host is not None:
        times = dataclasses.replace(times, host=host)
    sessions = realtime_sessions(times, work, batching.slots)
    return sessions, times, describe(times, work, sessions, batching.slots)


def describe(times: StepTimes, work: Workload, sessions: int, slots: int) -> str:
    """The start-up log's line."""
    def fmt(t: Mapping[int, float]) -> str:
        return ", ".join(f"{b}: {ms:.1f}" for b, ms in sorted(t.items()))

    return (f"real-time capacity {sessions} of {slots} session slots (steady demand within {work.budget:.0%} of the device "
            f"and of the interpreter; frame {1000 * work.frame_s:.0f} ms, {work.tokens_per_frame:.2f} thinker steps per frame); "
            f"ms per step by rows: thinker {fmt(times.thinker)}; talker {fmt(times.talker)}; "
            f"codec groups {fmt(times.codec)}; host "
            + (f"{times.host:.2f} ms per session and frame" if times.host else "not measured (reply too short, or no free slot)"))
