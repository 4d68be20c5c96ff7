"""The ``omni`` engine: Qwen2.5-Omni / Qwen3-Omni on transformers, streamed thinker → talker → codec.

Needs ``torch`` and ``transformers`` (5.x); nothing is imported from them until a model loads.

What the engine takes in and gives out:

* audio in: ``TurnMessage.audio`` (int16, 16 kHz) → Whisper-style log-mel (the config's
  ``num_mel_bins``) → the thinker's audio tower. The number of placeholders comes from each
  model's own length formula. Clips are zero-padded to 0.1 s and cut to their last 300 s.
* images in: ``TurnMessage.images`` (HxWx3 uint8) → Qwen2-VL patches → the vision encoder, with
  3-D rotary positions (``get_rope_index``). This works for both architectures (tested with tiny
  random models). Video reaches the engine as such images, frames sampled by the transport
  (WebRTC: 1 per second by default); the models' own video input is not used.
* text in / text out: Qwen chat template rendered straight to token ids. Qwen2.5-Omni gets its
  official system prompt (required for speech output), with the session instructions after it.
* audio out: 24 kHz int16 from the talker's codes (Qwen2.5: token2wav DiT + BigVGAN; Qwen3:
  code2wav), decoded in chunks.

Where things are:

* ``model.py``: the stage wiring (``OmniModel``), configured by its ``OmniSettings`` section
  (``engines/settings.py``); ``session.py``: one conversation on it (``OmniSession``);
  ``loader.py``: checkpoints and random builds.
* ``thinker.py`` (with ``thinker_prefill.py``, ``thinker_steps.py``, ``prompt.py``, ``context.py``,
  ``sampling.py``): the streaming thinker and the session's resumable context.
* ``talker.py`` (with ``talker_stream.py``, ``talker_prefix.py``, ``talker_qwen25.py``,
  ``talker_qwen3.py``, ``code_predictor.py``): how the reference ``generate``'s talker is
  reproduced step by step, paced to the listener once a reply's audio has started.
* ``codec.py``: chunked decoding with left context; each window carries when its listener needs it.
* ``graphs.py``: static KV caches, CUDA graphs and per-stage CUDA streams (the GPU fast path).
* ``batching/``: what the sessions of one model share: per-stage KV slots, one batched step loop
  per stage (thinker; the talker's whole frame), batched prefills and codec windows, admission.
"""

from .loader import detect_architecture, load_omni, read_config
from .model import OmniModel
from .session import OmniSession

__all__ = ["OmniModel", "OmniSession", "detect_architecture", "load_omni", "read_config"]
