"""What a session holds, in bytes: estimates cheap enough for every event.

The estimates count what dominates memory (string and byte payloads, sample arrays) and a flat
overhead per container entry; they are meant for limits, not for accounting to the byte.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: flat cost of one dict entry or list element (object headers, pointers)
ENTRY_BYTES = 16
#: nesting deeper than client JSON may go (strict_json stops at 32) is not followed
_MAX_DEPTH = 40


def approx_bytes(value: Any, depth: int = 0) -> int:
    """Roughly how many bytes ``value`` (JSON-like, with bytes and arrays) keeps alive."""
    if isinstance(value, str | bytes | bytearray):
        return len(value)
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if depth >= _MAX_DEPTH:
        return ENTRY_BYTES
    if isinstance(value, dict):
        return sum(ENTRY_BYTES + len(k) + approx_bytes(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(ENTRY_BYTES + approx_bytes(v, depth + 1) for v in value)
    return ENTRY_BYTES
