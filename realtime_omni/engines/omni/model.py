"""``OmniModel``: Qwen2.5-Omni / Qwen3-Omni on transformers as a streaming voice model.

Stage wiring (what the pipeline sees):

* ``think()`` streams one :class:`ThinkerOutput` per reply token (text delta + a
  :class:`~.context.TokenHidden` for the talker: ids only, the token's device rows go through the
  session's :class:`~.context.TokenRows`) and a last end-marker output;
* ``talk_boundary()`` hands every pending output to the talker at once (the talker consumes one
  token per codec frame, so it must see tokens as soon as they exist);
* ``talk()`` runs the talker as far as the tokens received allow and yields
  :class:`~realtime_omni.engines.base.TalkerOutput` with ``codes`` (a :class:`~.talker.CodeChunk`)
  every ``first_chunk_frames`` then ``chunk_frames`` frames;
* ``decode()`` turns a chunk into int16 audio at 24 kHz (``ModelInfo.output_rate``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base import ModelAtCapacity, ModelInfo, VoiceModel
from ..settings import OmniSettings
from . import graphs
from .batching.stages import OmniBatching
from .codec import CodecSettings, OmniCodec
from .codec_stream import CodecStream
from .host_time import HostTime
from .loader import (
    Arch,
    LoadedOmni,
    build_random,
    detect_architecture,
    load_omni,
    read_config,
)
from .session import OmniSession
from .talker import TalkerSettings
from .thinker import ThinkerSettings

log = logging.getLogger(__name__)

#: per-architecture chunking defaults (codec frames): Qwen2.5 frames are 20 ms, Qwen3 frames 80 ms
CHUNK_DEFAULTS: dict[str, dict[str, Any]] = {
    # 12 codes = one DiT block; 24-code windows of context; 2 codes held back and cross-faded;
    # 12 then 18 codes before the steady 24, so that each chunk is ready before the last one ends
    "qwen2_5_omni": dict(first_chunk_frames=12, chunk_frames=24, left_context_frames=24,
                         lookahead_frames=2, crossfade_ms=10.0, ramp_frames=(12, 18)),
    # causal codec: 2 frames (160 ms) first, 2, 4, then 8 (640 ms); 25 frames of context (the
    # reference). The second 2-frame chunk: with 32 replies under way a 4-frame second chunk
    # missed the first one's end in most sessions (docs/benchmarks/omni-capacity.md)
    "qwen3_omni_moe": dict(first_chunk_frames=2, chunk_frames=8, left_context_frames=25,
                           lookahead_frames=0, crossfade_ms=0.0, ramp_frames=(2, 4)),
}


class OmniModel(VoiceModel):
    """A Qwen2.5-Omni or Qwen3-Omni checkpoint served as thinker → talker → codec."""

    def __init__(
        self,
        path: str | Path | None = None,
        settings: OmniSettings | None = None,
        *,
        model_id: str | None = None,
        loaded: LoadedOmni | None = None,
    ) -> None:
        settings = settings if settings is not None else OmniSettings()
        self.settings = settings
        #: its sessions' talkers take a reply in one call, fed token by token (the worker's traits read it)
        self.talks_live = settings.live_talker
        device, dtype = settings.device, settings.resolved_dtype
        first_chunk_frames, chunk_frames = settings.first_chunk_frames, settings.chunk_frames
        left_context_frames, lookahead_frames = settings.left_context_frames, settings.lookahead_frames
        crossfade_ms, ramp_frames = settings.crossfade_ms, settings.ramp_frames
        max_sessions, cuda_graphs, cache_tokens = settings.max_sessions, settings.cuda_graphs, settings.cache_tokens
        talker_max_new_tokens = settings.talker_max_frames
        attn_implementation, seed = settings.attn_implementation, settings.seed
        self.path = Path(path).expanduser() if path is not None else None
        self.device = device
        self.dtype = dtype
        self.attn_implementation = attn_implementation
        self.loaded: LoadedOmni | None = loaded
        if loaded is not None:
            arch: Arch = loaded.arch
            raw: dict[str, Any] = {}
        else:
            if self.path is None:
                raise ValueError("OmniModel needs a checkpoint path")
            raw = read_config(self.path)  # ValueError for a bad path / missing config.json
            arch = detect_architecture(raw, where=str(self.path / "config.json"))
        self.arch = arch
        defaults = CHUNK_DEFAULTS[arch]
        self.first_chunk_frames = int(first_chunk_frames or defaults["first_chunk_frames"])
        self.chunk_frames = int(chunk_frames or defaults["chunk_frames"])
        self.left_context_frames = int(defaults["left_context_frames"] if left_context_frames is None
                                       else left_context_frames)
        self.lookahead_frames = int(defaults["lookahead_frames"] if lookahead_frames is None else lookahead_frames)
        self.crossfade_ms = float(defaults["crossfade_ms"] if crossfade_ms is None else crossfade_ms)
        if ramp_frames is None:
            # the default ramp belongs to the default chunk sizes
            custom = first_chunk_frames is not None or chunk_frames is not None
            ramp_frames = () if custom else defaults["ramp_frames"]
        self.ramp_frames = tuple(int(f) for f in ramp_frames)
        if min(self.first_chunk_frames, self.chunk_frames, *self.ramp_frames) < 1 or self.left_context_frames < 0:
            raise ValueError("chunk sizes must be >= 1 frame and the left context >= 0")
        self.seed = seed
        self.cuda_graphs = bool(cuda_graphs)
        if max_sessions < 0:
            raise ValueError("max_sessions must be >= 0 (0: every session steps alone)")
        #: sessions that share the batched stages (one slot each); 0 turns batching off
        self.max_sessions = int(max_sessions)
        self.batch_gather_s = float(settings.batch_gather_ms) / 1000.0
        self.prefill_burst_s = float(settings.prefill_burst_ms) / 1000.0
        self.lookahead_steps = max(1, int(settings.lookahead_steps))
        self.dit_steps = int(settings.dit_steps)
        self.dit_dtype = settings.dit_dtype
        self.codec_queued_pieces = int(settings.codec_queued_pieces)
        self.codec_shared_pool = bool(settings.codec_shared_pool)
        self.pipelined_steps = bool(settings.pipelined_steps)
        #: benchmarks: build the checkpoint's config with random weights (no weight files read)
        self.random_weights = bool(settings.random_weights)
        self.batching: OmniBatching | None = None
        self.thinker_settings = ThinkerSettings(max_new_tokens=settings.max_new_tokens,
                                                system_prompt=settings.system_prompt,
                                                do_sample=settings.thinker_do_sample, ignore_eos=settings.ignore_eos,
                                                cache_tokens=cache_tokens, cuda_graphs=self.cuda_graphs)
        self.talker_settings = TalkerSettings(
            do_sample=True if settings.talker_do_sample is None else settings.talker_do_sample,
            max_new_tokens=talker_max_new_tokens, first_chunk_frames=self.first_chunk_frames,
            chunk_frames=self.chunk_frames, ramp_frames=self.ramp_frames, chars_per_second=settings.chars_per_second,
            ignore_eos=settings.ignore_eos,
            cache_tokens=cache_tokens + talker_max_new_tokens + 16, cuda_graphs=self.cuda_graphs,
            pace_lead_s=settings.pace_lead_ms / 1000.0,
        )
        self._apply_generation_config()
        self.codec: OmniCodec | None = None
        caps = {"audio_in", "text_in", "audio_out", "text_out"}
        vision = ((raw.get("thinker_config") or {}).get("vision_config") if raw else
                  getattr(loaded.config.thinker_config, "vision_config", None))
        if vision is not None:
            caps.add("image_in")
        name = model_id or ("omni" if self.path is None else self.path.name or "omni")
        self.info = ModelInfo(id=name, capabilities=frozenset(caps), output_rate=24_000, hears_audio=True,
                              max_sessions=self.max_sessions or None)
        self.vad: Any = None  # set by load() when silero is installed
        #: the interpreter time its sessions' own threads take, by stage (``host_time.py``)
        self.host_time = HostTime()
        #: the batched steps' times measured for the capacity (``estimate_capacity``), when measured
        self.capacity_times: Any = None
        #: the sessions admitted: the real-time capacity measured at load (``measure_capacity``)
        self.realtime_capacity: int | None = None
        self._sessions: set[OmniSession] = set()
        self._opening = 0  # sessions being opened, counted against the capacity
        self._lock = threading.Lock()
        if loaded is not None:
            self._setup_codec()
            self._note_tools()

    @classmethod
    def random(cls, config: Any, settings: OmniSettings, model_id: str | None = None,
               progress: Callable[[str], None] = lambda _msg: None) -> OmniModel:
        """Real-size model with random weights from a (reconstructed) config (benchmarks)."""
        loaded = build_random(config, device=settings.device, dtype=settings.resolved_dtype)
        model = cls(settings=settings, model_id=model_id, loaded=loaded)
        model.warm_up(progress)  # as load() does: the benchmarks measure what a server's users meet
        return model

    def _apply_generation_config(self) -> None:
        """Talker sampling from ``generation_config.json`` (``talker_*`` keys) when present."""
        if self.path is None:
            return
        gen = self.path / "generation_config.json"
        if not gen.is_file():
            return
        try:
            data = json.loads(gen.read_text())
        except (OSError, json.JSONDecodeError):
            return
        for key in ("temperature", "top_k", "top_p", "repetition_penalty"):
            if f"talker_{key}" in data:
                setattr(self.talker_settings, key, data[f"talker_{key}"])

    def _setup_codec(self) -> None:
        if self.max_sessions and self.batching is None:
            self.batching = OmniBatching(
                self.loaded, slots=self.max_sessions, thinker_tokens=max(64, self.thinker_settings.cache_tokens),
                talker_tokens=self.talker_settings.cache_tokens, graphs=self.cuda_graphs,
                talker_settings=self.talker_settings, thinker_settings=self.thinker_settings,
                gather_s=self.batch_gather_s, lookahead=self.lookahead_steps, pipelined=self.pipelined_steps,
                prefill_burst_s=self.prefill_burst_s)
        self.codec = OmniCodec(self.loaded, CodecSettings(
            left_context_frames=self.left_context_frames, lookahead_frames=self.lookahead_frames,
            crossfade_ms=self.crossfade_ms, seed=self.seed or 0, cuda_graphs=self.cuda_graphs,
            dit_steps=self.dit_steps, dit_dtype=self.dit_dtype, queued_pieces=self.codec_queued_pieces,
            shared_pool=self.codec_shared_pool,
        ), batch_windows=self.batching is not None, batch_rows=self.max_sessions)
        if self.batching is not None and self.codec.batcher is not None:
            # the replies of one talker prefill batch reach the codec together (expect_first)
            self.batching.talker_prefill.on_finished = self.codec.batcher.expect_first

    def load(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        if self.loaded is None and self.random_weights:
            progress(f"building {self.arch} from {self.path / 'config.json'} with RANDOM weights (benchmarks only)")
            self.loaded = build_random(self.path / "config.json", device=self.device, dtype=self.dtype,
                                       attn_implementation=self.attn_implementation, progress=progress)
        elif self.loaded is None:
            self.loaded = load_omni(self.path, device=self.device, dtype=self.dtype,
                                    attn_implementation=self.attn_implementation, progress=progress)
        self.loaded.lean_code_predictor = self.settings.lean_code_predictor
        self._setup_codec()
        progress(f"{self.loaded.arch} ready on {self.loaded.device} ({self.loaded.dtype}); "
                 f"speakers: {', '.join(self.loaded.speakers)}")
        if self.batching is not None:
            progress(self.batching.describe())
        self.vad = _optional_vad(progress)
        if self.vad is not None:
            self.info = dataclasses.replace(self.info, capabilities=self.info.capabilities | {"vad"})
        self._note_tools(progress)
        self.warm_up(progress)

    def warm_up(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        """What the first users would otherwise pay, paid while the model loads: every step's
        graph captured; on CUDA the batched prefills run once alone and a few at once, the
        batched steps are timed to admit no more sessions than they keep in real time, then the
        load's heap is frozen out of the garbage collector's full passes (which would stop every
        loop and session at once while they scan it)."""
        self.warm_graphs(progress)
        cuda = self.batching is not None and self.loaded is not None and self.loaded.device_type == "cuda"
        if cuda:
            from .warmup import warm_prefills  # (off CUDA: no one-time cost)

            warm_prefills(self, progress=progress)
        self.measure_capacity(progress)  # (after the warm-ups' sessions: the admission limit holds from here)
        if cuda:
            from .warmup import freeze_heap  # (tests keep their heap)

            freeze_heap(progress)

    def measure_capacity(self, progress: Callable[[str], None] = lambda _msg: None) -> int | None:
        """Admit no more sessions than the batched steps keep in real time (the setting
        ``realtime_admission``; see :meth:`estimate_capacity`). Returns the capacity, or None
        when it is not measured."""
        mode = self.settings.realtime_admission
        if self.batching is None or self.loaded is None or mode == "off" or (
                mode == "auto" and self.loaded.device_type != "cuda"):
            return None
        sessions, line = self.estimate_capacity()
        progress(line)
        if sessions < 1:
            # a measurement on a device busy with something else (another process mid-shutdown)
            # must not shut every user out until a restart: one session is admitted
            log.warning("omni %s: not even one session measured in real time; admitting one (set "
                        "realtime_admission=off to admit by the slots, or check what else runs on %s)",
                        self.info.id, self.device)
            progress("real-time capacity below one session: admitting one")
            sessions = 1
        self.realtime_capacity = sessions
        self.info = dataclasses.replace(self.info, max_sessions=sessions)
        return sessions

    def estimate_capacity(self, budget: float | None = None) -> tuple[int, str]:
        """The sessions the batched steps keep in real time, all speaking at once, from their step
        times measured now (call while no session speaks), and the start-up log's line saying so."""
        from .batching import capacity

        sessions, self.capacity_times, line = capacity.estimate(
            self, self.settings.realtime_budget if budget is None else budget)
        return sessions, line

    def _note_tools(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        """Function calls where the vocabulary has the Qwen call tokens (and llguidance is there)."""
        if self.loaded is not None and self.loaded.tools is not None:
            self.info = dataclasses.replace(self.info, capabilities=self.info.capabilities | {"tools"})
        else:
            progress("function calls off: the tokenizer has no <tool_call> token, or llguidance is not installed")

    def warm_graphs(self, progress: Callable[[str], None] = lambda _msg: None) -> dict[str, bool]:
        """On CUDA: check every step for host syncs and capture it once (a throw-away session and
        reply-shaped codec windows), while nothing else runs. Steps that sync stay eager."""
        loaded = self.loaded
        if not self.cuda_graphs or loaded is None or loaded.device_type != "cuda":
            return {}
        import torch

        with graphs.probing():
            if self.batching is not None:
                self.batching.warm()
            session = self.open_session()
            session.close()
            codec = self.codec
            if codec is not None:
                high = codec.max_code + 1
                groups = () if self.arch == "qwen2_5_omni" else (codec.groups,)
                # the reply's chunk sizes, far enough to reach the steady window, twice: a window
                # shape is captured on its second use (and only here, see shape_graphs.ShapeGraphs)
                sizes = [self.first_chunk_frames, *self.ramp_frames] + [self.chunk_frames] * 6
                for _ in range(2):
                    stream = CodecStream.of(codec, turn=0, speaker=None, seed=0)
                    start = 0
                    for size in sizes:
                        stream.push(torch.randint(0, high, (size, *groups)), start=start)
                        start += size
                # a reply's last window: the longest it can be with the default left context
                longest = self.chunk_frames + self.lookahead_frames + self.left_context_frames + codec.block
                if codec.batcher is not None:
                    keys = codec.batcher.capture_groups()
                    progress(f"codec: {len(keys)} window shapes captured for groups of "
                             f"{', '.join(map(str, codec.batcher.buckets))} sessions")
                    if codec.batcher.mixer is not None:
                        mixed = codec.batcher.mixer.capture(keys, longest)
                        progress(f"codec: windows of {', '.join(map(str, mixed))} codes (and any length up to "
                                 f"{max(mixed, default=0)}) decode together in one DiT pass")
                added = codec.capture_last_windows(longest)
                progress(f"codec: last windows replay {len(codec.last_window_lengths)} lengths "
                         f"({len(added)} captured for them)")
        found = graphs.verdicts()
        progress("CUDA graphs: " + ", ".join(f"{k} {'on' if v else 'off'}" for k, v in found.items()))
        memory = graphs.memory_line(self.loaded.device)
        if memory is not None:
            progress(memory)
        return found

    def stats(self) -> dict[str, dict[str, float]]:
        batching, codec = self.batching, self.codec
        if batching is None:
            return {}
        talking = batching.talker.activity
        out: dict[str, dict[str, float]] = {"slots": {
            "total": batching.slots, "in_use": batching.thinker_pool.in_use,
            # replies being spoken, and those of them held back ahead of their listener: when few
            # are held back while many speak, the GPU has no time to spare
            "speaking": talking.count + talking.paused_count, "paced": talking.paused_count}}
        if self.realtime_capacity is not None:
            out["slots"]["realtime_capacity"] = self.realtime_capacity
        out["session threads"] = self.host_time.stats()
        loops = {b.name: b for b in batching.batchers}
        loops.update({"thinker prefill": batching.prefill, "talker prefill": batching.talker_prefill})
        if codec is not None and codec.batcher is not None:
            loops["codec"] = codec.batcher
        for name, loop in loops.items():
            st = loop.stats()
            out[name] = {"steps": st["steps"], "rows": st["rows"], "busy_s": st["busy_s"]}
            # decode loops: where their time goes (idle_s, host_s, device_wait_s, cpu_s)
            out[name].update({f"{phase}_s": seconds for phase, seconds in st.get("phase_s", {}).items()})
            # prefills: how long new turns waited for a batch, and until their prefill was done
            out[name].update({k: st[k] for k in ("requests", "wait_s", "latency_s") if k in st})
            # the codec: windows by a captured graph or eagerly, and passes of several lengths
            out[name].update({k: st[k] for k in ("graph_rows", "eager_rows", "mixed_passes") if k in st})
        return out

    def open_session(self) -> OmniSession:
        if self.loaded is None:
            raise RuntimeError("OmniModel.load() has not run")
        limit = self.realtime_capacity  # (the slots themselves refuse with SlotsFull)
        with self._lock:
            if limit is not None and len(self._sessions) + self._opening >= limit:
                # the measured real-time capacity, below the slots (in-process sessions; a worker
                # process admits by the same number before it gets here)
                raise ModelAtCapacity(f"{limit} sessions are this model's real-time capacity; all are in use")
            self._opening += 1
        try:
            session = OmniSession(self)
        except BaseException:
            with self._lock:
                self._opening -= 1
            raise
        with self._lock:
            self._opening -= 1
            self._sessions.add(session)
        return session

    def session_closed(self, session: OmniSession) -> None:
        with self._lock:
            self._sessions.discard(session)

    @property
    def open_sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    def close(self) -> None:
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.close()
        if self.batching is not None:
            self.batching.close()
            self.batching = None
        if self.codec is not None:
            self.codec.close()
        self.loaded = None
        self.codec = None
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass


def _optional_vad(progress: Callable[[str], None]) -> Any:
    """Server VAD for omni sessions: the embedded silero model when that extra is installed."""
    try:
        from ..embedded.vad_silero import SileroVAD
    except ImportError:
        progress("no VAD available (install the 'embedded' extra for server turn detection)")
        return None
    return SileroVAD()
