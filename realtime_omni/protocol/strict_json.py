"""JSON as clients may send it: standard (no NaN / Infinity, no number that overflows to
infinity such as ``1e400``) and nested at most ``MAX_DEPTH`` deep.

Python's ``json`` accepts ``NaN`` and ``Infinity`` and recurses once per nesting level, so a
100 000-deep array raised ``RecursionError`` where a parse error was due. Events of the protocol
nest a few levels; anything deeper than ``MAX_DEPTH`` is refused as invalid JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 is valid JSON but no number a setting can take
        raise ValueError(f"{text} is out of range")
    return value


def loads(raw: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that raises ``ValueError`` for NaN / Infinity and for nesting deeper than
    ``max_depth``."""
    try:
        value = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > max_depth:
            raise ValueError(f"JSON nested deeper than {max_depth} levels")
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return value
