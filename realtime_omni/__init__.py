"""realtime_omni: a realtime, full-duplex streaming server for speech and omni models."""

__version__ = "0.1.0"
