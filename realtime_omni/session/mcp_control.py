"""MCP tools in the session core: listing a server's tools, offering them to the model, running
the calls it makes (or asking the client first), and going on with the results. A mixin of
:class:`~.core.RealtimeSession`, split out by topic like :mod:`.response_control`.

The flow, as the Realtime protocol has it:

- ``session.update`` names a server: an ``mcp_list_tools`` item joins the conversation,
  ``mcp_list_tools.in_progress``, then ``.completed`` (the item lists the tools) or ``.failed``
  (with an ``error`` event saying why). Listed tools are offered to the model like functions.
- The model calls one: an ``mcp_call`` output item, its arguments streamed
  (``response.mcp_call_arguments.delta/done``), ``response.mcp_call.in_progress``, the server
  runs it, ``response.mcp_call.completed`` or ``.failed``. The response ends after its calls,
  and a new one starts by itself so the model can answer with the results (at most
  :data:`MAX_CONTINUATIONS` in a row, so a model that keeps calling cannot loop for ever).
- A tool that needs approval (``require_approval``, "always" by default): the response ends with
  an ``mcp_approval_request`` item; the client adds an ``mcp_approval_response`` item, and its
  next ``response.create`` runs the approved call first, then lets the model answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..engines.base import ToolSpec
from ..mcp.servers import MAX_SERVERS, McpServer, url_allowed
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.server_events import server_event
from . import actions as act
from .conversation import Item, new_id
from .tools import MAX_TOTAL_CHARS, ToolChoice, check_function, prompt_chars

if TYPE_CHECKING:
    from ..mcp.client import ListedTool
    from .responses import Response

#: replies started by themselves after MCP results, one after another
MAX_CONTINUATIONS = 3

#: a listed tool as the model sees it: (spec, tool name on its server, whether it asks first)
Offered = tuple[ToolSpec, str, bool]


class McpControl:
    """Mixed into :class:`~.core.RealtimeSession` (``self`` is the session)."""

    def _init_mcp(self, timeout_s: float) -> None:
        self.mcp_timeout_s = timeout_s
        #: server label → its listed tools, as offered to the model
        self.mcp_offered: dict[str, list[Offered]] = {}
        #: mcp_list_tools item id → the server being listed
        self._mcp_listing: dict[str, McpServer] = {}
        #: approval requests whose call has been handed to the driver (each runs once)
        self._mcp_ran: set[str] = set()

    # ---------------------------------------------------------------- listing
    def _mcp_servers_changed(self, before: list[McpServer]) -> None:
        """After a session.update: list new or changed servers, forget removed ones."""
        current = {server.label: server for server in self.config.mcp}
        for server in before:
            if current.get(server.label) != server:
                self.mcp_offered.pop(server.label, None)
        for server in self.config.mcp:
            if server not in before:
                self._list_mcp(server)

    def _list_mcp(self, server: McpServer) -> None:
        for item_id, listing in list(self._mcp_listing.items()):
            if listing.label == server.label:  # superseded: its answer will be dropped
                self._fail_listing(item_id)
        if len(self._mcp_listing) >= MAX_SERVERS:  # bounded: a client cannot pile requests up
            self.error(ProtocolError(ErrorCode.RATE_LIMIT_EXCEEDED, f"MCP server {server.label!r}: {MAX_SERVERS} "
                                     "listings are already under way; update the session again once they end",
                                     param="session.tools", type="rate_limit_error"))
            return
        item = Item(id=new_id("mcpl"), role=None, type="mcp_list_tools", status="in_progress", server_label=server.label)
        previous = self._add_item(item)
        self._emit(server_event("conversation.item.added", previous_item_id=previous, item=item.to_dict()))
        self._emit(server_event("mcp_list_tools.in_progress", item_id=item.id))
        self._mcp_listing[item.id] = server
        self._actions.append(act.ListMcpTools(item.id, server, self.mcp_timeout_s))

    def _fail_listing(self, item_id: str) -> None:
        """A listing that failed or is no longer awaited: its item is closed (``incomplete``)."""
        self._mcp_listing.pop(item_id, None)
        item = self.conversation.find(item_id)
        if item is not None and item.status == "in_progress":
            item.status = "incomplete"
            self._emit(server_event("conversation.item.done", item=item.to_dict()))
        self._emit(server_event("mcp_list_tools.failed", item_id=item_id))

    def on_mcp_tools_listed(self, item_id: str, tools: tuple[ListedTool, ...], error: dict[str, Any] | None) -> None:
        """Driver callback: a server's listing (or why there is none)."""
        server = self._mcp_listing.pop(item_id, None)
        if server is None or server not in self.config.mcp or self.closed:
            return  # the server was removed or listed again meanwhile
        if error is not None:
            self._fail_listing(item_id)
            self.error(ProtocolError(ErrorCode.MCP_LIST_TOOLS_FAILED, f"MCP server {server.label!r}: "
                                     f"{error.get('message', 'listing its tools failed')}", param="session.tools",
                                     type="server_error"))
            return
        offered, refused = self._offer(server, tools)
        self.mcp_offered[server.label] = offered
        item = self.conversation.find(item_id)
        if item is not None:
            item.status = "completed"
            item.tools = [tool.to_dict() for tool in tools if tool.name in {o[1] for o in offered}]
            self._emit(server_event("conversation.item.done", item=item.to_dict()))
        self._emit(server_event("mcp_list_tools.completed", item_id=item_id))
        if refused:
            self.error(ProtocolError(ErrorCode.INVALID_VALUE, f"MCP server {server.label!r}: tools left out: "
                                     + "; ".join(refused)[:1000], param="session.tools", type="server_error"))

    def _offer(self, server: McpServer, tools: tuple[ListedTool, ...]) -> tuple[list[Offered], list[str]]:
        """The allowed tools that pass the checks a client's function passes, under names no
        other tool of the session uses."""
        taken = {tool.name for tool in self.config.tools}
        # every response renders all the tools into the prompt: the functions' budget holds for all
        used = sum(map(prompt_chars, self.config.tools))
        for label, others in self.mcp_offered.items():
            if label != server.label:
                taken |= {spec.name for spec, _, _ in others}
                used += sum(prompt_chars(spec) for spec, _, _ in others)
        offered: list[Offered] = []
        refused: list[str] = []
        for tool in tools:
            if not server.allows(tool.name, tool.read_only):
                continue
            if tool.name in taken:
                refused.append(f"{tool.name[:64]!r} has the name of another tool")
                continue
            try:
                spec = check_function({"description": tool.description, "parameters": tool.input_schema},
                                      tool.name, f"tools.{server.label}")
                size = prompt_chars(spec)
            except ProtocolError as exc:
                refused.append(f"{tool.name[:64]!r}: {exc.message}")
                continue
            except Exception:  # noqa: BLE001 - a schema nested past the checker's recursion, say
                refused.append(f"{tool.name[:64]!r}: its schema could not be checked")
                continue
            if used + size > MAX_TOTAL_CHARS:
                refused.append(f"{tool.name[:64]!r}: the tools would pass {MAX_TOTAL_CHARS} characters in all")
                continue
            used += size
            taken.add(tool.name)
            offered.append((spec, tool.name, server.needs_approval(tool.name, tool.read_only)))
        return offered, refused

    # ---------------------------------------------------------------- offering
    def _with_mcp(self, tools: list[ToolSpec], choice: ToolChoice
                  ) -> tuple[list[ToolSpec], ToolChoice, dict[str, tuple[str, str, bool]]]:
        """The response's tools with the listed MCP tools added, and their routes (function name
        → server label, tool name, whether it asks first); an MCP tool choice narrows the tools
        to that server's (and names one, when it did)."""
        offered = self.mcp_offered
        if choice.server_label is not None:
            mine = offered.get(choice.server_label, [])
            if choice.name is not None and choice.name not in {name for _, name, _ in mine}:
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"MCP server {choice.server_label!r} has listed no tool "
                                    f"{choice.name!r}", param="tool_choice.name")
            if not mine:
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"MCP server {choice.server_label!r} has no tools listed "
                                    "(yet)", param="tool_choice.server_label")
            offered = {choice.server_label: mine}
            tools, choice = [], ToolChoice("required", choice.name)
        routes: dict[str, tuple[str, str, bool]] = {}
        functions = {tool.name for tool in tools}
        for label, listed in offered.items():
            for spec, name, asks in listed:
                if spec.name in functions:
                    continue  # a function declared since the listing: the name stays the function's
                routes[spec.name] = (label, name, asks)
                tools = [*tools, spec]
        return tools, choice, routes

    # ---------------------------------------------------------------- calls
    def _dispatch_mcp(self, response: Response) -> None:
        """Hand the response's calls whose arguments are complete to the driver."""
        servers = {server.label: server for server in self.config.mcp}
        ready, response.mcp_ready = response.mcp_ready, []
        for call in ready:
            server = servers.get(call.server_label)
            offered = {name for _, name, _ in self.mcp_offered.get(call.server_label, [])}
            if server is None or call.name not in offered or not url_allowed(server.url, self.config.mcp_urls):
                response.end_mcp_call(self._emit, call.id, "", {"type": "tool_execution_error", "message":
                                      f"tool {call.name[:64]!r} of MCP server {call.server_label!r} is no longer "
                                      "among the session's tools"})
                continue
            if call.approval_request_id:
                self._mcp_ran.add(call.approval_request_id)
            self._actions.append(act.CallMcpTool(response.id, response.epoch, call.id, server, call.name,
                                                 call.arguments, self.mcp_timeout_s))

    def _run_approved(self, response: Response) -> None:
        """At a response's start: the approved requests not yet run become its first calls."""
        answered = {i.approval_request_id: i for i in self.conversation if i.type == "mcp_approval_response"}
        done = self._mcp_ran | {i.approval_request_id for i in self.conversation if i.type == "mcp_call"}
        for request in list(self.conversation):
            answer = answered.get(request.id)
            if request.type != "mcp_approval_request" or answer is None or not answer.approve or request.id in done:
                continue
            call = Item(id=new_id("mcp"), role=None, type="mcp_call", status="in_progress", name=request.name,
                        server_label=request.server_label, arguments=request.arguments, approval_request_id=request.id)
            response.add_output(self._emit, call)
            response.start_mcp_call(self._emit, call)
        self._dispatch_mcp(response)

    def _check_approval(self, item: Item) -> None:
        """An ``mcp_approval_response`` must answer a request of this session, once."""
        request = self.conversation.get(item.approval_request_id, param="item.approval_request_id")
        if request.type != "mcp_approval_request":
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"item {request.id!r} is not an mcp_approval_request",
                                param="item.approval_request_id")
        if any(i.type == "mcp_approval_response" and i.approval_request_id == request.id for i in self.conversation):
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"approval request {request.id!r} is already answered",
                                param="item.approval_request_id")

    def on_mcp_call_done(self, response_id: str, epoch: int, item_id: str, output: str,
                         error: dict[str, Any] | None) -> None:
        """Driver callback: a call's result. The last one ends the response if the model has
        (and starts the next, to answer with it), or lets its model start."""
        response = self._live(response_id, epoch)
        if response is None or not response.end_mcp_call(self._emit, item_id, output, error):
            return  # cancelled meanwhile: the item was closed when the response ended
        if response.mcp_running:
            return
        if not response.pipeline_started:
            self._maybe_start_pipeline()
        elif response.deferred_end is not None:
            status, message, reason = response.deferred_end
            self.on_response_end(response.id, response.epoch, status, message, reason)

    def _continue_after_mcp(self, response: Response) -> None:
        """A completed response that ran MCP calls: the model answers with their results."""
        # calls the model made (approved ones ran before it answered, in the same response)
        ran = any(item.type == "mcp_call" and not item.approval_request_id for item in response.outputs)
        if response.status != "completed" or not ran or response.continuation is None or self.closed:
            return
        params, tools, choice, count = response.continuation
        if not response.in_conversation or params.get("input") is not None:
            return  # the result is not in what the next response would read: the client goes on
        if count >= MAX_CONTINUATIONS:
            return
        if choice.mode == "required":
            choice = ToolChoice("auto")  # the call was made: now the answer
        self._create_response(params, tools=tools, choice=choice, continued=count + 1)
