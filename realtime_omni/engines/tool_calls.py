"""Function calls held to their tools' schemas: the grammar, and the parser of the call's text.

Each engine writes a call in its model's own format and writes its opening itself (the model
only decides whether to begin one, under ``tool_choice: auto``). From the function's name on, a
grammar built from the tools' JSON schemas (llguidance's Lark dialect, each schema embedded with
``%json``) lets the model write only a declared name, then arguments that match that function's
schema and close the call: ``<name>", "arguments": {...}}``. The arguments are therefore always
valid JSON. :class:`CallParser` turns that constrained text back into a name and a stream of
argument deltas. The embedded engine's format is in :mod:`.embedded.tool_calls`, the omni
engine's (Qwen's) in :mod:`.omni.tool_calls`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from .base import ToolCallDelta, ToolSpec

#: a grammar larger than this is refused (it is compiled for every call)
MAX_GRAMMAR_CHARS = 1024 * 1024
#: what follows the function's name, up to its arguments
NAME_END = '", "arguments": '


class ToolGrammarError(ValueError):
    """A tool's parameters schema cannot be turned into a grammar."""


def call_grammar(tools: Sequence[ToolSpec], named: bool) -> str:
    """The grammar (llguidance Lark) of what the model writes after a call's opening, which ends
    with ``{"name": "`` (after the name and :data:`NAME_END` too when ``named``): one declared
    name, its arguments, ``}``.

    Each tool's schema is checked on its own, so an error names the tool it comes from."""
    alternatives = []
    for index, tool in enumerate(tools):
        schema = json.dumps({**_closed(tool.parameters), "x-guidance": _JSON_STYLE}, ensure_ascii=True)
        rule = f"tool{index}: %json {schema}"
        error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark("start: " + rule[len(f"tool{index}: "):]))
        if error and not error.startswith("WARNING"):
            raise ToolGrammarError(f"tool {tool.name!r}: its parameters schema has no grammar: {error.strip()}")
        head = "" if named else _literal(tool.name + NAME_END) + " "
        alternatives.append((f"{head}tool{index} \"}}\"", rule))
    grammar = "start: " + " | ".join(a for a, _ in alternatives) + "\n" + "\n".join(r for _, r in alternatives) + "\n"
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise ToolGrammarError(f"the tools' grammar takes {len(grammar)} characters; at most {MAX_GRAMMAR_CHARS}")
    return grammar


#: arguments written the way calls are rendered back to the model: one line, ", " and ": "
#: (free whitespace let a small model pad its arguments with newlines until the token limit)
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")


#: the longest string argument a schema leaves free (no ``maxLength``, ``enum``, ``const``,
#: ``pattern`` or ``format`` of its own): a small model held only to "a JSON string" could write one
#: until the token limit, and the call would never close
FREE_STRING_CHARS = 512


def _closed(schema: object) -> object:
    """A copy of ``schema`` held to what function-calling APIs mean by it: an object that declares
    its properties takes no others unless it says so (JSON Schema allows extra properties by
    default, and a small model held to the open form wrote invented properties until it ran out of
    tokens), and a free string takes at most :data:`FREE_STRING_CHARS` characters."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _closed(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS or key in ("items", "additionalProperties", "not", "if", "then", "else"):
            out[key] = _closed(value)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    if out.get("type") == "string" and not {"maxLength", "enum", "const", "pattern", "format"} & out.keys():
        out["maxLength"] = FREE_STRING_CHARS
    return out


def compile_call_grammar(grammar: str, tokenizer: llguidance.LLTokenizer) -> llguidance.LLMatcher:
    """A matcher for one call; a grammar the engine cannot compile fails the response cleanly."""
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    if matcher.is_error():
        raise ToolGrammarError(f"the tools' grammar does not compile: {matcher.get_error().strip()}")
    return matcher


class AllowedTokens:
    """What a call's matcher lets the model pick next, as a bool array over the token ids (one
    bitmask buffer, filled again for every token)."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int) -> None:
        self._matcher = matcher
        self._vocab = vocab
        self._bits = allocate_token_bitmask(1, vocab)

    def __call__(self, size: int | None = None) -> np.ndarray:
        """``(size,)`` bools (default: the tokenizer's vocabulary); ids past the tokenizer's
        vocabulary, a model head's padding, are never allowed."""
        fill_next_token_bitmask(self._matcher, self._bits)
        mask = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._vocab].astype(bool)
        if size is None or size == self._vocab:
            return mask
        out = np.zeros((size,), dtype=bool)
        n = min(size, self._vocab)
        out[:n] = mask[:n]
        return out


def _literal(text: str) -> str:
    """A Lark string literal matching ``text`` exactly (JSON escapes, all of ASCII)."""
    return json.dumps(text, ensure_ascii=True)


class CallParser:
    """Constrained call text (after the opening's ``{"name": "``) → a name, then argument deltas.

    Argument text is passed on as it comes except a tail of spaces and ``}``, which may turn out
    to be the call's own closing brace; :meth:`finish` releases the rest.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(names)
        self._text = ""
        self.name: str | None = None
        self._start = 0  # where the arguments begin in _text
        self._sent = 0  # argument characters already passed on

    def feed(self, piece: str) -> list[ToolCallDelta]:
        self._text += piece
        out: list[ToolCallDelta] = []
        if self.name is None:
            for name in self._names:
                if self._text.startswith(name + NAME_END):
                    self.name, self._start = name, len(name + NAME_END)
                    out.append(ToolCallDelta(name=name))
                    break
            else:
                return out
        args = self._text[self._start:]
        safe = len(args.rstrip(" \t\n}"))
        if safe > self._sent:
            out.append(ToolCallDelta(name=self.name, delta=args[self._sent:safe]))
            self._sent = safe
        return out

    def finish(self) -> ToolCallDelta:
        """The closing piece, with the whole argument text (valid JSON, or ValueError)."""
        body = self._text[self._start:].rstrip()
        if self.name is None or not body.endswith("}"):
            raise ValueError("the function call was cut off before its arguments were complete")
        arguments = body[:-1].rstrip()
        json.loads(arguments)  # the grammar guarantees it; a failure here is a bug, not the model's
        return ToolCallDelta(name=self.name, delta=arguments[self._sent:], done=True, arguments=arguments)
