"""Response pipeline: thinker ─▶ talker ─▶ codec stages joined by bounded, epoch-fenced queues."""

from .stages import Chunk, PipelineSettings, ResponsePipeline, Sink

__all__ = ["Chunk", "PipelineSettings", "ResponsePipeline", "Sink"]
