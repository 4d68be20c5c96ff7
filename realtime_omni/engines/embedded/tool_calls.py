"""Function calling for the llama.cpp thinker: the prompt, the grammar, and the call parser.

A call is written in the model's text as ``<tool_call>{"name": "<name>", "arguments": {...}}``.
The server writes the opening ``<tool_call>{"name": "`` itself (the model only decides whether to
begin it, under ``tool_choice: auto``); from there a GBNF grammar built from the tools' JSON
schemas lets the model write only a declared name and arguments that match that function's
schema, so the arguments are always valid JSON. :class:`CallParser` turns that constrained text
back into a name and a stream of argument deltas.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import llama_cpp
from llama_cpp.llama_grammar import SchemaConverter

from ..base import ToolCall, ToolCallDelta, ToolSpec

MARKER = "<tool_call>"
END_MARKER = "</tool_call>"
#: what the server writes before the model picks a function
CALL_PREFIX = MARKER + '{"name": "'
#: a grammar larger than this is refused (llama.cpp parses it for every call)
MAX_GRAMMAR_CHARS = 1024 * 1024
#: what follows the function's name, up to its arguments
NAME_END = '", "arguments": '


class ToolGrammarError(ValueError):
    """A tool's parameters schema cannot be turned into a grammar."""


def tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """The part of the system prompt that declares the functions and how to call them."""
    lines = [json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}) for t in tools]
    return ("You can call these functions:\n<tools>\n" + "\n".join(lines) + "\n</tools>\n"
            "When one of them is needed, reply with only " + MARKER + '{"name": <function name>, "arguments": '
            "<arguments object>}" + END_MARKER + ". When a function has returned, answer with its result.")


def render_call(call: ToolCall) -> str:
    """A call as it appears in the conversation the model reads."""
    return CALL_PREFIX + call.name + NAME_END + (call.arguments.strip() or "{}") + "}" + END_MARKER


class _Converter(SchemaConverter):
    """llama-cpp-python's JSON-schema converter with complete literal escaping: its own leaves
    backslashes as they are, so a property name or enum value holding a quote or a backslash
    (JSON-escaped into the literal) made a grammar llama.cpp cannot parse."""

    def _format_literal(self, literal: str) -> str:
        return _literal(literal)


def call_grammar(tools: Sequence[ToolSpec], named: bool) -> str:
    """GBNF for what the model writes after :data:`CALL_PREFIX` (after the name and
    :data:`NAME_END` too when ``named``): one declared name, its schema's arguments, ``}``."""
    converter = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    alternatives = []
    for index, tool in enumerate(tools):
        rule = f"tool{index}"
        try:
            schema = converter.resolve_refs(json.loads(json.dumps(tool.parameters)), rule)
            converter.visit(schema, rule)
        except Exception as exc:  # noqa: BLE001 - the converter raises many kinds on odd schemas
            raise ToolGrammarError(f"tool {tool.name!r}: its parameters schema has no grammar: {exc}") from None
        head = "" if named else _literal(tool.name + NAME_END) + " "
        alternatives.append(f'{head}{rule} "}}"')
    grammar = converter.format_grammar() + "\nroot ::= " + " | ".join(alternatives) + "\n"
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise ToolGrammarError(f"the tools' grammar takes {len(grammar)} characters; at most {MAX_GRAMMAR_CHARS}")
    return grammar


def check_grammar(llm: llama_cpp.Llama, grammar: str) -> None:
    """Parse the grammar against this model's vocabulary (llama.cpp returns NULL on an error,
    which the sampler chain would dereference), so a bad one fails the response cleanly."""
    sampler = llama_cpp.llama_sampler_init_grammar(llm._model.vocab, grammar.encode(), b"root")
    if not sampler:
        raise ToolGrammarError("llama.cpp could not parse the tools' grammar")
    llama_cpp.llama_sampler_free(sampler)


def _literal(text: str) -> str:
    """A GBNF string literal matching ``text`` exactly (control characters as ``\\xHH``)."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


class CallParser:
    """Constrained call text (after :data:`CALL_PREFIX`) → a name, then argument deltas.

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
