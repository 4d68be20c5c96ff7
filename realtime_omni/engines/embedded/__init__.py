"""In-process CPU cascade (Silero VAD, Whisper tiny.en, SmolLM2-135M, Piper) from pip-installed weights."""

from .model import EmbeddedModel, EmbeddedSession

__all__ = ["EmbeddedModel", "EmbeddedSession"]
