"""The OpenAI Realtime event model: client event parsing, server event building, errors."""

from .client_events import parse_client_event
from .errors import ProtocolError

__all__ = ["ProtocolError", "parse_client_event"]
