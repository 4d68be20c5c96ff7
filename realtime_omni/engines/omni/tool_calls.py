"""Function calls on the omni thinker, in the Qwen models' own format.

Qwen2.5-Omni and Qwen3-Omni were trained on the Qwen chat template's tool format: the functions
are declared in the system message between ``<tools>`` tags, one JSON object per line, and a call
is the reply ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, where
``<tool_call>`` and ``</tool_call>`` are single tokens of the vocabulary. A function's result comes
back as a user message wrapped in ``<tool_response>`` tags.

The model decides to call by picking ``<tool_call>`` as its reply's first token (``auto``), or
the engine writes it (``required``). From there :class:`CallDecoding` drives the tokens: the
engine writes ``\\n{"name": "`` (and the name, when one is imposed), then every token is picked
under the mask of the grammar in :mod:`..tool_calls`, so the arguments always match the
function's schema. A model whose vocabulary lacks the two tokens takes no tools.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..base import ThinkRequest, ToolCall, ToolCallDelta, ToolSpec
from ..tool_calls import NAME_END, AllowedTokens, CallParser, call_grammar, compile_call_grammar
from .detokenize import TextDeltas

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
#: what the engine writes after ``<tool_call>``, before the model picks a function
BODY_PREFIX = '\n{"name": "'


@dataclass
class ToolSupport:
    """The call format's token ids in one model's vocabulary, and llguidance's view of it."""

    open: int
    close: int
    newline: list[int]
    tokenizer: Any
    vocab: int  # rows of the model's head (may pass the tokenizer's size: padding)
    _guidance: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, tokenizer: Any, vocab: int) -> ToolSupport | None:
        """The format's tokens, or None where the model cannot take tools: the vocabulary has no
        single token for either tag (a checkpoint not trained on them, or the byte-level
        stand-in of random weights), or llguidance is not installed."""
        try:
            import llguidance  # noqa: F401
        except ImportError:
            return None
        ids = []
        for tag in (OPEN, CLOSE):
            encoded = list(tokenizer.encode(tag, add_special_tokens=False))
            if len(encoded) != 1:
                return None
            ids.append(int(encoded[0]))
        return cls(open=ids[0], close=ids[1], newline=list(tokenizer.encode("\n", add_special_tokens=False)),
                   tokenizer=tokenizer, vocab=int(vocab))

    def guidance(self) -> Any:
        """llguidance's tokenizer (built on the first call: about a second)."""
        with self._lock:
            if self._guidance is None:
                import llguidance.hf

                self._guidance = llguidance.hf.from_tokenizer(self.tokenizer)
            return self._guidance

    def decoding(self, request: ThinkRequest) -> CallDecoding:
        return CallDecoding(request, self)


def tools_block(tools: Sequence[ToolSpec]) -> str:
    """The system message's part that declares the functions (the template's wording)."""
    lines = [json.dumps({"type": "function", "function": {"name": t.name, "description": t.description,
                                                          "parameters": t.parameters}}) for t in tools]
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            + "\n".join(lines) + "\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def call_body(call: ToolCall) -> str:
    """The text between the tags of a call (the model wrote it so: the grammar fixes the spacing)."""
    return BODY_PREFIX + call.name + NAME_END + (call.arguments.strip() or "{}") + "}\n"


def response_text(output: str) -> str:
    """A function's output as the user message that brings it back."""
    return "<tool_response>\n" + output + "\n</tool_response>"


def call_mode(request: ThinkRequest, support: ToolSupport | None) -> str:
    """``auto`` / ``required`` / ``none`` for this reply (``none`` without tools or tool tokens)."""
    if support is None or not request.tools:
        return "none"
    return request.tool_choice


class CallDecoding:
    """One call being written: the tokens the engine forces, then a mask per picked token.

    ``forced()`` is what follows ``<tool_call>`` before the model chooses; after it, each
    :meth:`allowed` mask holds the next token to the grammar and :meth:`take` reads the picked
    token back, returning the call's deltas. :attr:`complete` once the call's JSON has closed.
    """

    def __init__(self, request: ThinkRequest, support: ToolSupport) -> None:
        named = request.tool_name if request.tool_choice == "required" else None
        tools = [t for t in request.tools if t.name == named] if named else list(request.tools)
        if not tools:
            raise ValueError(f"tool_choice names {named!r}, which is not among the session's tools")
        guidance = support.guidance()
        self._tokenizer = support.tokenizer
        self._matcher = compile_call_grammar(call_grammar(tools, named=named is not None), guidance)
        self._parser = CallParser([t.name for t in tools])
        self._vocab = support.vocab
        self._allowed = AllowedTokens(self._matcher, int(guidance.vocab_size))
        self._head = BODY_PREFIX + (named + NAME_END if named else "")
        self._named = named
        self._ids: list[int] = []  # the constrained tokens so far
        self._text = ""
        self._deltas = TextDeltas(self._tokenizer, skip_special_tokens=False)
        self.complete = False

    def forced(self) -> list[int]:
        return list(self._tokenizer.encode(self._head, add_special_tokens=False))

    def opening(self) -> list[ToolCallDelta]:
        """The deltas the forced part already gives (the name, when imposed)."""
        return self._parser.feed(self._named + NAME_END) if self._named else []

    def allowed(self) -> np.ndarray:
        """(vocab,) bool over the model's head: the tokens the grammar lets it pick next."""
        return self._allowed(self._vocab)

    def take(self, token: int) -> list[ToolCallDelta]:
        """The picked ``token``: the call's new deltas; the last one when the call closed."""
        if not self._matcher.consume_token(int(token)):
            raise RuntimeError(f"token {token} is outside the call's grammar: {self._matcher.get_error()}")
        self._ids.append(int(token))
        piece = self._deltas.delta(self._ids)
        self._text += piece
        deltas = self._parser.feed(piece) if piece else []
        if self._matcher.is_accepting():
            self.complete = True
            deltas.append(self._parser.finish())
        return deltas
