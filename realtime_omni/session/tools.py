"""Function tools of a session or response: validated once, where the client sends them.

``session.update`` and ``response.create`` carry ``tools`` and ``tool_choice`` as the SDK types
them (``parameters`` is any JSON value there). Here they become :class:`ToolSpec` lists and a
:class:`ToolChoice`, or a :class:`ProtocolError` naming the field at fault: a bad schema is
refused when it is set, not when the model first tries to call it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from ..engines.base import ToolChoiceMode, ToolSpec
from ..protocol.errors import ErrorCode, ProtocolError
from ..mcp.servers import MAX_SERVERS, McpServer, parse_mcp_server

MAX_TOOLS = 128
#: the JSON text of one tool's parameters schema (it is rendered into the model's prompt)
MAX_SCHEMA_CHARS = 16 * 1024
MAX_DESCRIPTION_CHARS = 4096
#: all the tools together (every response renders them into the prompt)
MAX_TOTAL_CHARS = 128 * 1024
#: arguments of a function_call item and the output of a function_call_output item
MAX_TOOL_TEXT_CHARS = 256 * 1024
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: counts a schema may ask for (string lengths, item counts, regex repetitions): a grammar
#: engine writes a rule per repetition, so ``minLength: 10**8`` would be a 500 MB grammar
MAX_SCHEMA_COUNT = 1024
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
           "maxContains")
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = "auto"
    #: the one function to call when the choice named one (mode is then "required")
    name: str | None = None
    #: an MCP server's tools to choose from (``{"type": "mcp", "server_label": ...}``)
    server_label: str | None = None

    def to_dict(self) -> str | dict[str, str]:
        if self.server_label is not None:
            return {"type": "mcp", "server_label": self.server_label} | ({"name": self.name} if self.name else {})
        return {"type": "function", "name": self.name} if self.name else self.mode


def parse_tools(value: Any, param: str, mcp_urls: tuple[str, ...] = ()) -> tuple[list[ToolSpec], list[McpServer]]:
    """A ``tools`` list → function specs and MCP servers (``invalid_value`` and the field at
    fault otherwise). ``mcp_urls``: the server URLs the operator allows (none: MCP is refused)."""
    if not isinstance(value, list):
        raise ProtocolError(ErrorCode.INVALID_VALUE, "tools must be a list", param=param)
    if len(value) > MAX_TOOLS:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"at most {MAX_TOOLS} tools, got {len(value)}", param=param)
    specs: list[ToolSpec] = []
    servers: list[McpServer] = []
    for index, tool in enumerate(value):
        at = f"{param}.{index}"
        match tool:
            case {"type": "mcp"}:
                server = parse_mcp_server(tool, at, mcp_urls)
                if any(s.label == server.label for s in servers):
                    raise ProtocolError(ErrorCode.INVALID_VALUE, f"server_label {server.label!r} is declared twice",
                                        param=f"{at}.server_label")
                if len(servers) >= MAX_SERVERS:
                    raise ProtocolError(ErrorCode.INVALID_VALUE, f"at most {MAX_SERVERS} MCP servers", param=at)
                servers.append(server)
            case {"name": str(name)} if tool.get("type", "function") == "function":
                specs.append(_function(tool, name, at))
            case _:
                raise ProtocolError(ErrorCode.INVALID_VALUE, "a tool needs a string 'name' and type 'function'", param=at)
    total = sum(map(prompt_chars, specs))
    if total > MAX_TOTAL_CHARS:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"the tools take {total} characters; at most {MAX_TOTAL_CHARS} in all",
                            param=param)
    names = [spec.name for spec in specs]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"tool name {name!r} is declared twice", param=f"{param}.{index}.name")
    return specs, servers


def prompt_chars(spec: ToolSpec) -> int:
    """What a tool adds to every response's prompt, counted against :data:`MAX_TOTAL_CHARS`."""
    return len(json.dumps(spec.parameters)) + len(spec.description)


def check_function(tool: dict[str, Any], name: str, at: str) -> ToolSpec:
    """One function (or an MCP server's listed tool) checked as a client's function is."""
    return _function(tool, name, at)


def _function(tool: dict[str, Any], name: str, at: str) -> ToolSpec:
    if not _NAME.match(name):
        raise ProtocolError(ErrorCode.INVALID_VALUE, "a tool name is 1 to 64 letters, digits, '_' or '-'", param=f"{at}.name")
    description = tool.get("description") or ""
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"description longer than {MAX_DESCRIPTION_CHARS} characters",
                            param=f"{at}.description")
    parameters = tool.get("parameters")
    if parameters is None:
        parameters = dict(_EMPTY_OBJECT)
    if not isinstance(parameters, dict):
        raise ProtocolError(ErrorCode.INVALID_VALUE, "parameters must be a JSON schema object", param=f"{at}.parameters")
    if len(json.dumps(parameters)) > MAX_SCHEMA_CHARS:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"parameters schema longer than {MAX_SCHEMA_CHARS} characters",
                            param=f"{at}.parameters")
    if parameters.get("type", "object") != "object":
        raise ProtocolError(ErrorCode.INVALID_VALUE, "parameters must describe a JSON object (type 'object')",
                            param=f"{at}.parameters.type")
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as exc:
        where = ".".join(str(p) for p in exc.path)
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"parameters is not a valid JSON schema: {exc.message[:200]}",
                            param=f"{at}.parameters" + (f".{where}" if where else "")) from None
    _no_remote_refs(parameters, f"{at}.parameters")
    _bounded_counts(parameters, f"{at}.parameters")
    return ToolSpec(name=name, description=description, parameters={"type": "object", **parameters})


def _no_remote_refs(schema: Any, param: str) -> None:
    """Only local ``#/...`` references: nothing is ever fetched to compile a schema."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"remote $ref {ref[:100]!r} is not allowed", param=param)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _bounded_counts(schema: Any, param: str) -> None:
    """Counts in a schema stay at most :data:`MAX_SCHEMA_COUNT`, in keywords and in patterns."""
    stack: list[tuple[Any, str]] = [(schema, param)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            for key in _COUNTS:
                value = node.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > MAX_SCHEMA_COUNT:
                    raise ProtocolError(ErrorCode.INVALID_VALUE, f"{key} is at most {MAX_SCHEMA_COUNT} here, got {value}",
                                        param=f"{at}.{key}")
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                for match in _REPEAT.finditer(pattern):
                    if any(int(n) > MAX_SCHEMA_COUNT for n in match.groups() if n):
                        raise ProtocolError(ErrorCode.INVALID_VALUE, f"pattern repetition {match.group(0)[:40]} exceeds "
                                            f"{MAX_SCHEMA_COUNT}", param=f"{at}.pattern")
            stack.extend((value, f"{at}.{key}") for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((value, f"{at}.{index}") for index, value in enumerate(node))


def parse_tool_choice(value: Any, tools: list[ToolSpec], param: str, servers: list[McpServer] = ()) -> ToolChoice:  # type: ignore[assignment]
    """``auto`` / ``none`` / ``required`` / ``{"type": "function", "name": ...}`` /
    ``{"type": "mcp", "server_label": ..., "name": ...}`` → a choice; a named function must be
    among the given tools, an MCP choice's server among the servers (its tools are known once
    listed: a response checks the name)."""
    match value:
        case "auto" | "none":
            return ToolChoice(value)
        case "required":  # needs a tool only when a response runs (see session.config.tools_of)
            return ToolChoice("required")
        case {"type": "function", "name": str(name)}:
            if name not in {tool.name for tool in tools}:
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"tool_choice names {name!r}, which is not among the tools",
                                    param=f"{param}.name")
            return ToolChoice("required", name)
        case {"type": "mcp", "server_label": str(label)}:
            if label not in {server.label for server in servers}:
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"tool_choice names MCP server {label!r}, which is not "
                                    "among the tools", param=f"{param}.server_label")
            name = value.get("name")
            if name is not None and not isinstance(name, str):
                raise ProtocolError(ErrorCode.INVALID_VALUE, "name is a string", param=f"{param}.name")
            return ToolChoice("required", name, label)
        case _:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "tool_choice must be auto, none, required or a function",
                                param=param)


def check_tool_text(text: str, param: str) -> None:
    if len(text) > MAX_TOOL_TEXT_CHARS:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"{param.rsplit('.', 1)[-1]} longer than {MAX_TOOL_TEXT_CHARS} "
                            f"characters ({len(text)})", param=param)
