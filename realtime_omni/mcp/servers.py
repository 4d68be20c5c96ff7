"""MCP servers a session names in its tools: validated where the client sends them.

A ``{"type": "mcp", ...}`` tool names a remote MCP server (``server_url``) whose tools the model
may call. The server makes every request itself, so a client could point it anywhere: only URLs
under the operator's ``tools.mcp_allowed_urls`` are accepted (none by default: MCP is off),
compared by scheme, host, port and path (no dot segments), and requests leave that origin by no
redirect (see :mod:`realtime_omni.mcp.client`).

Here a tool dict becomes an :class:`McpServer`; listing, calling and the items and events they
make live in :mod:`realtime_omni.session.mcp_control`.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from ..protocol.errors import ErrorCode, ProtocolError

MAX_SERVERS = 8
MAX_HEADERS = 32
MAX_HEADER_CHARS = 4096
MAX_FILTER_NAMES = 128
_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
#: headers a client may not set: they steer the connection or the request itself (a ``Host``
#: could reach another virtual host behind an allowed proxy), or the MCP session
_RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
                               "trailer", "keep-alive", "expect", "cookie", "accept-encoding"})
_RESERVED_PREFIXES = ("proxy-", "mcp-")


class ToolFilter(BaseModel):
    """Tool names and/or the read-only hint (``annotations.readOnlyHint``) a tool must match."""

    model_config = ConfigDict(frozen=True)

    names: frozenset[str] | None = None
    read_only: bool | None = None

    def matches(self, name: str, read_only: bool) -> bool:
        if self.names is not None and name not in self.names:
            return False
        return self.read_only is None or self.read_only == read_only

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.names is not None:
            out["tool_names"] = sorted(self.names)
        if self.read_only is not None:
            out["read_only"] = self.read_only
        return out


class McpServer(BaseModel):
    """A server a session named; part of its settings (and of what a store keeps of them)."""

    model_config = ConfigDict(frozen=True)

    label: str
    url: str
    description: str = ""
    #: sent with every request (``authorization`` becomes ``Authorization: Bearer ...``); never
    #: echoed, and not stored with the session (a resumed session's listing then goes without)
    headers: dict[str, str] = Field(default_factory=dict, exclude=True, repr=False)
    #: tools the model may see (None: all the server lists)
    allowed: ToolFilter | None = None
    #: "always"/"never", or filters: tools matching ``never`` run at once, the rest ask first
    approval: Literal["always", "never"] | None = "always"
    approval_always: ToolFilter | None = None
    approval_never: ToolFilter | None = None

    def allows(self, name: str, read_only: bool) -> bool:
        return self.allowed is None or self.allowed.matches(name, read_only)

    def needs_approval(self, name: str, read_only: bool) -> bool:
        if self.approval is not None:
            return self.approval == "always"
        if self.approval_never is not None and self.approval_never.matches(name, read_only):
            return False
        return True  # named in ``always``, or in neither: asking is the safe side

    def to_dict(self) -> dict[str, Any]:
        """The tool as ``session.updated`` reports it (headers and tokens left out)."""
        out: dict[str, Any] = {"type": "mcp", "server_label": self.label, "server_url": self.url}
        if self.description:
            out["server_description"] = self.description
        if self.allowed is not None:
            out["allowed_tools"] = self.allowed.to_dict()
        if self.approval is not None:
            out["require_approval"] = self.approval
        else:
            out["require_approval"] = {k: f.to_dict() for k, f in (("always", self.approval_always),
                                                                    ("never", self.approval_never)) if f is not None}
        return out


def mcp_available() -> bool:
    """Whether the ``mcp`` package (the ``mcp`` extra) is installed."""
    return importlib.util.find_spec("mcp") is not None


def _origin_and_path(url: str) -> tuple[str, str, int | None, str] | None:
    """(scheme, host, port, path) of an http(s) URL, lower-cased and with the default port; None
    when it cannot be compared safely (no host, credentials, dot segments raw or encoded)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host or parts.username is not None or parts.password is not None:
        return None
    segments = parts.path.lower().replace("%2e", ".").split("/")
    if any(segment in (".", "..") for segment in segments) or "\\" in url:
        return None
    return scheme, host, port if port is not None else (443 if scheme == "https" else 80), parts.path or "/"


def url_allowed(url: str, allowed: tuple[str, ...]) -> bool:
    """``url`` has the scheme, host and port of one of the operator's prefixes and its path is
    that prefix's path or below it (at a ``/`` boundary)."""
    target = _origin_and_path(url)
    if target is None:
        return False
    for prefix in allowed:
        base = _origin_and_path(prefix)
        if base is None or base[:3] != target[:3]:
            continue
        root = base[3].rstrip("/")
        if not root or target[3] == root or target[3].startswith(root + "/"):
            return True
    return False


def parse_mcp_server(tool: dict[str, Any], at: str, allowed_urls: tuple[str, ...]) -> McpServer:
    """A client's ``{"type": "mcp", ...}`` tool → :class:`McpServer`, or a ProtocolError naming
    the field at fault."""
    label = tool.get("server_label")
    if not isinstance(label, str) or not _LABEL.match(label):
        raise ProtocolError(ErrorCode.INVALID_VALUE, "server_label is 1 to 64 letters, digits, '_' or '-'",
                            param=f"{at}.server_label")
    for unsupported in ("connector_id", "tunnel_id"):
        if tool.get(unsupported):
            raise ProtocolError(ErrorCode.UNSUPPORTED, f"{unsupported} is not supported by this server; give a "
                                "server_url", param=f"{at}.{unsupported}")
    url = tool.get("server_url")
    if not isinstance(url, str) or not url:
        raise ProtocolError(ErrorCode.INVALID_VALUE, "an MCP tool needs a server_url", param=f"{at}.server_url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise ProtocolError(ErrorCode.INVALID_VALUE, "server_url must be an http(s) URL without credentials",
                            param=f"{at}.server_url")
    if not url_allowed(url, allowed_urls):
        raise ProtocolError(ErrorCode.MCP_SERVER_NOT_ALLOWED,
                            "this server_url is not among the MCP servers this server may contact "
                            "(tools.mcp_allowed_urls)" if allowed_urls else
                            "MCP servers are off on this server (tools.mcp_allowed_urls is empty)",
                            param=f"{at}.server_url")
    if not mcp_available():
        raise ProtocolError(ErrorCode.UNSUPPORTED, "MCP tools need the 'mcp' extra installed on the server "
                            "(pip install 'realtime-omni[mcp]')", param=f"{at}.type")
    headers = _headers(tool.get("headers"), tool.get("authorization"), at)
    description = tool.get("server_description") or ""
    if not isinstance(description, str) or len(description) > 4096:
        raise ProtocolError(ErrorCode.INVALID_VALUE, "server_description is a string of at most 4096 characters",
                            param=f"{at}.server_description")
    allowed = _filter(tool["allowed_tools"], f"{at}.allowed_tools") if tool.get("allowed_tools") is not None else None
    approval: Literal["always", "never"] | None = "always"
    always = never = None
    match tool.get("require_approval"):
        case None:
            pass
        case "always" | "never" as policy:
            approval = policy
        case {**filters} if set(filters) <= {"always", "never"}:
            approval = None
            if filters.get("always") is not None:
                always = _filter(filters["always"], f"{at}.require_approval.always")
            if filters.get("never") is not None:
                never = _filter(filters["never"], f"{at}.require_approval.never")
        case _:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "require_approval is 'always', 'never' or "
                                "{always: filter, never: filter}", param=f"{at}.require_approval")
    return McpServer(label=label, url=url, description=description, headers=headers, allowed=allowed,
                     approval=approval, approval_always=always, approval_never=never)


def _headers(value: Any, authorization: Any, at: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    if value is not None:
        if not isinstance(value, dict) or len(value) > MAX_HEADERS:
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"headers is an object of at most {MAX_HEADERS} strings",
                                param=f"{at}.headers")
        for name, text in value.items():
            if not isinstance(name, str) or not _HEADER_NAME.match(name):
                raise ProtocolError(ErrorCode.INVALID_VALUE, "a header name is a token of at most 128 characters",
                                    param=f"{at}.headers")
            if name.lower() in _RESERVED_HEADERS or name.lower().startswith(_RESERVED_PREFIXES):
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"header {name!r} cannot be set by a client",
                                    param=f"{at}.headers.{name}")
            if not isinstance(text, str) or len(text) > MAX_HEADER_CHARS or any(c in text for c in "\r\n\0"):
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"header {name!r}: a single-line string of at most "
                                    f"{MAX_HEADER_CHARS} characters", param=f"{at}.headers.{name}")
            headers[name] = text
    if authorization is not None:
        if not isinstance(authorization, str) or len(authorization) > MAX_HEADER_CHARS or any(c in authorization for c in "\r\n\0"):
            raise ProtocolError(ErrorCode.INVALID_VALUE, "authorization is a single-line token", param=f"{at}.authorization")
        headers["Authorization"] = f"Bearer {authorization}"
    return headers


def _filter(value: Any, at: str) -> ToolFilter:
    """``["a", "b"]`` or ``{"tool_names": [...], "read_only": bool}`` → :class:`ToolFilter`."""
    names: Any = value
    read_only = None
    if isinstance(value, dict):
        if not set(value) <= {"tool_names", "read_only"}:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "a tool filter has tool_names and/or read_only", param=at)
        names, read_only = value.get("tool_names"), value.get("read_only")
        if read_only is not None and not isinstance(read_only, bool):
            raise ProtocolError(ErrorCode.INVALID_VALUE, "read_only is true or false", param=f"{at}.read_only")
    if names is not None:
        if (not isinstance(names, list) or len(names) > MAX_FILTER_NAMES
                or not all(isinstance(n, str) and 0 < len(n) <= 128 for n in names)):
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"tool names: a list of at most {MAX_FILTER_NAMES} names",
                                param=at)
        names = frozenset(names)
    return ToolFilter(names=names, read_only=read_only)
