"""Audio edges: PCM16 framing, G.711, stateful resampling and wire formats."""

from .formats import AudioFormat, parse_audio_format
from .resample import StreamResampler

__all__ = ["AudioFormat", "StreamResampler", "parse_audio_format"]
