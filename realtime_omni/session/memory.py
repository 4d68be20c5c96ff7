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
    total = 0
    if isinstance(value, dict):  # loops, not generators: this runs for every event sent
        for key, item in value.items():
            kind = type(item)
            if kind is str:  # the leaves of most events: no call per field
                total += ENTRY_BYTES + len(key) + len(item)
            elif kind is int or kind is float or kind is bool or item is None:
                total += 2 * ENTRY_BYTES + len(key)
            else:
                total += ENTRY_BYTES + len(key) + approx_bytes(item, depth + 1)
        return total
    if isinstance(value, list | tuple):
        for item in value:
            total += ENTRY_BYTES + approx_bytes(item, depth + 1)
        return total
    return ENTRY_BYTES
