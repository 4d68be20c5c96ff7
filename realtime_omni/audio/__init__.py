"""Audio edges: PCM16 framing, G.711, stateful resampling and wire formats."""

from .formats import AudioFormat, parse_audio_format
from .pcm import Pcm
from .resample import StreamResampler

__all__ = ["AudioFormat", "Pcm", "StreamResampler", "parse_audio_format"]
