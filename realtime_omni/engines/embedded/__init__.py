"""In-process CPU cascade (Silero VAD, Whisper tiny.en, SmolLM2-135M, Piper).

All weights come from pip packages (the ``embedded`` extra).
"""

from .model import EmbeddedModel, EmbeddedSession

__all__ = ["EmbeddedModel", "EmbeddedSession"]
