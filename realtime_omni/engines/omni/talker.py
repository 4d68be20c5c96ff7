"""Streaming talker: codec codes from the thinker's stream, starting on the first thinker token.

Both architectures consume exactly one reply token per codec frame, so the reference
``generate`` can be reproduced step by step as the thinker's tokens arrive:

Qwen2.5-Omni (``Qwen2_5OmniForConditionalGeneration.generate``)
    prefill  = [thinker context: last_hidden + embedding (0 at audio/image tokens)]
               + [embed(speaker BOS)] + [vec(g0)], with codec ``pad`` / ``bos`` embeddings added to
               the last two positions; rotary positions are the thinker's, then max+1, max+2.
    step s   = embed(code[s-1]) + R(s), R(s) = vec(g_s) while reply tokens last, then the
               ``tts_text_end`` embedding once, then ``tts_text_pad`` forever; stop on codec
               ``pad`` / ``end``; ``codec bos`` suppressed; repetition penalty over
               [mask × prompt, pad, bos, codes...].
Qwen3-Omni (``Qwen3OmniMoeForConditionalGeneration.generate`` + ``talker.prepare_inputs_for_generation``)
    prefill  = user-turn tokens of the whole context (text: text_projection(embedding); audio/image:
               hidden_projection(layer-``accept_hidden_layer`` hidden)) + the 9-position assistant part
               (header, 4 × tts_pad, tts_bos, first token; codec nothink/think_bos/think_eos/speaker/
               pad/bos).
    frame k  = codebook 0 sampled from the talker, codebooks 1..G-1 from the code predictor
               (prefill [talker hidden, embed(c0)], then one step per codebook).
    step k   = sum of the frame's codebook embeddings + T(k), T = text_projection(embedding) of
               g1.., the EOS token, then ``tts_eos``, then ``tts_pad`` forever; stop on codec EOS.

Step s needs reply token s (or the end of the reply), so the talker runs as far as the thinker's
stream allows on each ``talk()`` call and resumes on the next. With greedy decoding the thinker
tokens and talker codes are identical to the one-shot ``generate`` (tests check both models,
audio input included). Where this differs from the reference:

* sampling draws come from a per-session generator, so sampled runs differ draw by draw (same
  distributions, same top-k / top-p / temperature / repetition penalty / suppressed ids);
* Qwen2.5: ids token2wav cannot embed (``>= num_embeds + 1``, EOS excepted) are suppressed; a
  trained talker does not sample them, and the reference would crash on them;
* Qwen3: with audio *and* images in the context, rope positions of the talker prompt come from the
  thinker's ``get_rope_index`` (the talker's own copy reads a missing ``audio_config`` and the
  reference raises);
* later turns: the talker prompt is built from the cached context (thinker states computed turn by
  turn, the previous replies as generated token ids), not from a fresh prefill of the whole
  conversation re-tokenized — equal up to floating-point accumulation order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..base import TalkerOutput, ThinkerOutput
from .code_predictor import CodeFrames
from .context import TalkerPrompt, TokenHidden, TokenRows
from .graphs import StaticDecoder
from .loader import LoadedOmni
from .talker_qwen3 import Qwen3Stream
from .talker_qwen25 import Qwen25Stream
from .talker_prefix import TalkerPrefix, prefill_rows
from .talker_stream import CodeChunk, TalkerSettings, TalkerStream

if TYPE_CHECKING:
    from .batching.rows import SessionRows

__all__ = ["CodeChunk", "OmniTalker", "TalkerSettings"]

log = logging.getLogger(__name__)


class OmniTalker:
    """Per-session talker; keeps the running reply's talker state between ``talk()`` calls."""

    def __init__(self, loaded: LoadedOmni, settings: TalkerSettings, generator: Any = None,
                 rows: SessionRows | None = None, token_rows: TokenRows | None = None) -> None:
        self.loaded = loaded
        #: what the session's thinker hands over on the device (see :class:`TokenRows`)
        self.token_rows = token_rows if token_rows is not None else TokenRows()
        #: the session's slots in the model's batched talker and code predictor; None: alone
        self.rows = rows
        self.settings = settings
        self.generator = generator
        self.stream: TalkerStream | None = None
        self.lock = threading.Lock()
        # what :meth:`feed` handed :meth:`talk_live` for the reply being fed
        self._fed = threading.Event()
        self._fed_text = ""
        self._fed_final = False
        self.kind: type[TalkerStream] = Qwen25Stream if loaded.arch == "qwen2_5_omni" else Qwen3Stream
        # per session, reused by every reply: the static KV cache with its captured step, and
        # (Qwen3) the code predictor's captured frame
        self.decoder: StaticDecoder | None = None
        self.frames: CodeFrames | None = None
        # one reply at a time on the shared caches: a superseded reply's thread may still be
        # finishing a step when the next reply prefills
        self.step_lock = threading.Lock()
        #: what of the conversation the talker cache holds, reused by the next reply
        self.prefix = TalkerPrefix()
        self.closed = False

    def parts(self) -> tuple[StaticDecoder, CodeFrames | None]:
        if self.closed:
            raise RuntimeError("the session's talker is closed")
        rows = self.rows
        if self.decoder is None:
            self.decoder = self.kind.new_decoder(self.loaded, self.settings, rows.talker if rows else None)
            self.prefix.forget()  # a fresh cache holds nothing
        if self.frames is None and self.loaded.arch != "qwen2_5_omni" and rows is None:
            # (batched, the talker's frame step runs the code predictor itself)
            self.frames = CodeFrames(self.loaded, do_sample=self.settings.do_sample,
                                     cuda_graphs=self.settings.cuda_graphs, generator=self.generator)
        return self.decoder, self.frames

    def prepare(self) -> None:
        """Allocate the caches and capture the steps now (at session open), not on the first reply."""
        import torch

        with self.lock, torch.inference_mode():
            if self.closed:
                return
            decoder, frames = self.parts()
            if self.rows is not None:
                return  # the batched stages were captured when the model loaded
            decoder.capture_now(lambda: self.kind.dummy_prefill(self.loaded, decoder))
            if frames is not None:
                frames.graph.ensure_captured()

    def prefill_ahead(self, prompt: TalkerPrompt) -> int:
        """Run the conversation part of the next reply's talker prompt into the cache now (the
        thinker has just evaluated the user's turn ahead of the reply), so the reply runs only
        its own rows. Skipped (0) while a reply is being spoken. Returns the rows run."""
        import torch

        with self.lock, torch.inference_mode():
            if self.closed or (self.stream is not None and not self.stream.done):
                return 0
            context = self.kind.context_part(self.loaded, prompt)
            if context is None:
                return 0
            inputs, positions = context
            decoder, _frames = self.parts()
            if decoder.max_len < inputs.shape[0] + 16:
                return 0  # the reply could not follow it: leave the cache as it is
            with self.step_lock:
                _, run = prefill_rows(self.loaded, self.kind.forward, decoder,
                                      self.rows.talker if self.rows is not None else None, inputs, positions,
                                      inputs.shape[0], self.prefix)
        return run

    def talk(
        self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event, final: bool
    ) -> Iterator[TalkerOutput]:
        import torch

        with self.lock:
            if self.closed:  # a reply still draining after the session closed: nothing to say
                return
            self._add(segment, voice)
            stream = self.stream
        if stream is None:
            if final:
                yield TalkerOutput(text="".join(o.text for o in segment), final=True)
            return
        with torch.inference_mode(), self._streaming():
            yield from stream.run(cancelled, final)

    def feed(self, segment: list[ThinkerOutput], voice: str, final: bool, first: bool = False) -> None:
        """More of the reply for :meth:`talk_live` (which runs in another thread): the thinker's
        outputs as they come (``first``: a new reply's), and whether its text has ended."""
        with self.lock:
            if self.closed:
                return
            if first:
                self._fed_text, self._fed_final = "", False
            self._add(segment, voice)
            self._fed_text += "".join(o.text for o in segment)
            if final:
                self._fed_final = True
        self._fed.set()

    def talk_live(self, cancelled: threading.Event) -> Iterator[TalkerOutput]:
        """One call for a whole reply, fed by :meth:`feed`: the talker takes each token the
        moment it is fed, where :meth:`talk` is called again for it (through a worker process, a
        round trip per token). Between tokens the batched talker does not wait for this session,
        as between two :meth:`talk` calls."""
        import torch

        while not cancelled.is_set():
            self._fed.clear()
            with self.lock:
                if self.closed:
                    return
                stream, final = self.stream, self._fed_final
            if stream is not None:
                with torch.inference_mode(), self._streaming():
                    yield from stream.run(cancelled, final)
                if final or stream is not self.stream:
                    return  # the reply's last chunk is out, or a newer reply took over
            elif final:  # no token reached the talker: nothing to speak
                yield TalkerOutput(text=self._fed_text, final=True)
                return
            # outside ``_streaming``: the batched talker does not wait for this session meanwhile
            while not self._fed.wait(0.05) and not cancelled.is_set():
                pass

    def _add(self, segment: list[ThinkerOutput], voice: str) -> None:
        """Hand the thinker's outputs to the reply's talker stream (a new reply opens one);
        called under :attr:`lock`."""
        for out in segment:
            hidden = out.hidden
            if not isinstance(hidden, TokenHidden):
                continue
            if hidden.opens and hidden.prompt is None:
                hidden = dataclasses.replace(hidden, prompt=self.token_rows.prompt(hidden.turn))
                out = dataclasses.replace(out, hidden=hidden)
            stream = self.stream
            if stream is None or hidden.turn > stream.turn:
                speaker = self.loaded.speaker_for(voice)
                decoder, frames = self.parts()
                if stream is not None:
                    stream.close()  # superseded: it takes no further step on the shared caches
                stream = self.stream = self.kind(self.loaded, self.settings, self.generator,
                                                 hidden.turn, hidden.prompt, speaker, decoder, frames)
                stream.step_lock = self.step_lock
                stream.prefix = self.prefix
                stream.rows = self.rows.talker if self.rows is not None else None
                stream.token_rows = self.token_rows
            elif hidden.turn < stream.turn:
                continue  # a stale reply
            stream.add(out)

    def _streaming(self):
        """Counted among the sessions the batched talker waits for while this runs."""
        return (self.rows.talker.batcher.activity.streaming() if self.rows is not None
                else contextlib.nullcontext())

    def stop(self) -> None:
        """End the running reply (barge-in); the caches and graphs stay for the next one."""
        with self.lock:
            if self.stream is not None:
                self.stream.close()
            self.stream = None

    def close(self) -> None:
        self.stop()
        with self.lock, self.step_lock:  # not under a step still finishing in the talker thread
            self.closed = True
            if self.decoder is not None:
                self.decoder.release()
            self.decoder = None
            if self.frames is not None:
                self.frames.release()
            self.frames = None
