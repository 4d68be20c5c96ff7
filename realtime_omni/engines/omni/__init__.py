"""The ``omni`` engine: Qwen2.5-Omni / Qwen3-Omni on transformers, streamed thinker → talker → codec.

Needs ``torch`` and ``transformers`` (5.x); nothing is imported from them until a model loads.

What the engine takes in and gives out:

* audio in: ``TurnMessage.audio`` (int16, 16 kHz) → Whisper-style log-mel (the config's
  ``num_mel_bins``) → the thinker's audio tower. The number of placeholders comes from each
  model's own length formula. Clips are zero-padded to 0.1 s and cut to their last 300 s.
* images in: ``TurnMessage.images`` (HxWx3 uint8) → Qwen2-VL patches → the vision encoder, with
  3-D rotary positions (``get_rope_index``). This works for both architectures (tested with tiny
  random models). Video is not supported.
* text in / text out: Qwen chat template rendered straight to token ids. Qwen2.5-Omni gets its
  official system prompt (required for speech output), with the session instructions after it.
* audio out: 24 kHz int16 from the talker's codes (Qwen2.5: token2wav DiT + BigVGAN; Qwen3:
  code2wav), decoded in chunks.

See ``model.py`` for the stage wiring, ``talker.py`` for how the reference ``generate`` is
reproduced step by step, and ``codec.py`` for chunked decoding.
"""

from .loader import detect_architecture, load_omni, read_config
from .model import OmniModel, OmniSession

__all__ = ["OmniModel", "OmniSession", "detect_architecture", "load_omni", "read_config"]
