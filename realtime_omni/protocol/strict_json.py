"""JSON as clients may send it: standard (no NaN / Infinity, no number that overflows to
infinity such as ``1e400``, valid UTF-8) and nested at most ``MAX_DEPTH`` deep.

orjson parses it: it refuses what the standard refuses, stops at 1 024 levels where Python's
``json`` recursed into ``RecursionError``, and with the depth check takes 1.0 µs for an audio
append where ``json`` with its hooks took 5.4 (this runs for every chunk a client sends).
Events of the protocol nest a few levels; anything deeper than ``MAX_DEPTH`` is refused as
invalid JSON.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_DEPTH = 32


def loads(raw: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``raw``; ``ValueError`` for anything but standard JSON nested at most ``max_depth``."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # (a ValueError) its message is the reason
        raise ValueError(str(exc)) from None
    # orjson yields only dict, list and scalars: only the containers are followed
    stack = [(value, 1)] if type(value) is dict or type(value) is list else []
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"JSON nested deeper than {max_depth} levels")
        for child in item.values() if type(item) is dict else item:  # (a loop: once per client event)
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return value
