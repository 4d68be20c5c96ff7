"""The embedded thinker's call format: ``<tool_call>{"name": "<name>", "arguments": {...}}</tool_call>``.

SmolLM2 has no tool-call tokens of its own: the markers are plain text, declared in the system
prompt. The server writes :data:`CALL_PREFIX` itself; the grammar of :mod:`..tool_calls` holds
the rest.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..base import ToolCall, ToolSpec
from ..tool_calls import NAME_END

MARKER = "<tool_call>"
END_MARKER = "</tool_call>"
#: what the server writes before the model picks a function
CALL_PREFIX = MARKER + '{"name": "'


def tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """The part of the system prompt that declares the functions and how to call them."""
    lines = [json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}) for t in tools]
    return ("You can call these functions:\n<tools>\n" + "\n".join(lines) + "\n</tools>\n"
            "When one of them is needed, reply with only " + MARKER + '{"name": <function name>, "arguments": '
            "<arguments object>}" + END_MARKER + ". When a function has returned, answer with its result.")


def render_call(call: ToolCall) -> str:
    """A call as it appears in the conversation the model reads."""
    return CALL_PREFIX + call.name + NAME_END + (call.arguments.strip() or "{}") + "}" + END_MARKER
