"""The thinker's function calls: a reply that opens with ``<tool_call>`` is written under the
grammar of the called function (see :mod:`.tool_calls`) and never reaches the talker.

A call's tokens are forwarded one step at a time, with nothing queued ahead: each pick needs the
grammar's mask for it, and the mask depends on the token picked before. Batched, the mask is the
slot's suppressed ids in the shared thinker (``ThinkerTokens.restrict``), so the other sessions'
rows step on as usual; alone, it is applied to the step's logits before the same sampling rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..base import ThinkerOutput, ThinkRequest, ToolCall, TurnMessage
from .context import ReplyState
from .device_copy import to_device
from .prompt import fingerprint


class ThinkerCalls:
    """Mixed into :class:`~.thinker.StreamingThinker` (its ``loaded``, ``ctx``, ``rows``, ``lock``,
    ``_sampler`` and the step methods)."""

    def _banned(self, request: ThinkRequest) -> list[int]:
        """Ids a text reply may not pick: the call tags, where the request declares tools."""
        tools = self.loaded.tools
        return [tools.open, tools.close] if tools is not None and request.tools else []

    def _first_token(self, logits: Any, mode: str, request: ThinkRequest) -> int:
        """The reply's first token, from the prefill's logits: ``<tool_call>`` itself under
        ``required``; under ``auto`` the model may pick it; otherwise it may not."""
        import torch

        tools = self.loaded.tools
        if mode == "required":  # (a mode other than none means the model has the call tokens)
            return tools.open
        banned = [tools.close] if mode == "auto" else self._banned(request)
        return self._sampler(ban_ids(logits, banned), torch.tensor([self.ctx.ids], dtype=torch.long))

    def _call(self, request: ThinkRequest, turn: int, reply: ReplyState, counts: dict[str, int],
              max_new: int) -> Iterator[ThinkerOutput]:
        """Write the function calls of a reply that opened with ``<tool_call>`` (picked, not
        forwarded yet). After each call's ``</tool_call>`` the model chooses, between a newline
        and the end of its turn, whether another call follows (parallel calls, as the template
        writes them: one per ``<tool_call>`` block, a newline between)."""
        tools = self.loaded.tools
        assert tools is not None
        with self.lock:
            self._drain_ahead()  # text steps queued behind the opening tag: never read
        first = dict(counts)

        def out(delta) -> ThinkerOutput:
            nonlocal first
            piece = ThinkerOutput(text="", call=delta, **first)
            first = {}
            return piece

        ends = sorted(set(self.loaded.tokens.eos))
        made: list[ToolCall] = []
        while True:
            decoding = tools.decoding(request)
            for delta in decoding.opening():
                yield out(delta)
            picked = self._forward_run(request, turn, reply, [tools.open, *decoding.forced()], decoding.allowed())
            deltas: list = []
            while picked is not None and not decoding.complete:
                self._emit(reply, picked)
                deltas = decoding.take(picked)
                for delta in deltas:
                    yield out(delta)
                if decoding.complete or len(reply.ids) >= max_new:
                    break  # (cut by the token limit: the session reports the call incomplete)
                picked = self._forward_call_token(request, turn, reply, picked, decoding.allowed())
            if not decoding.complete:
                return
            made.append(ToolCall(deltas[-1].name, deltas[-1].arguments))
            with self.lock:
                reply.record.settle(_calls_fingerprint(made))
            if (not request.parallel_tool_calls or len(made) >= MAX_CALLS or len(tools.newline) != 1
                    or len(reply.ids) + 8 > max_new):
                # no other call (or no room for one): the closing enters with the next turn's prefill
                for token in (*tools.newline, tools.close):
                    self._emit(reply, token)
                return
            # forward the call's last token and its closing; the model then ends its turn or
            # writes a newline, which (as in the template) only another call may follow
            step = self._forward_run(request, turn, reply, [*tools.newline, tools.close],
                                     _only(tools, *tools.newline, *ends), tail=reply.ids[-1])
            if step is None or step in ends:
                return
            if self._forward_run(request, turn, reply, [step], _only(tools, tools.open)) is None:
                return

    def _forward_run(self, request: ThinkRequest, turn: int, reply: ReplyState, tokens: list[int], allowed: Any,
                     tail: int | None = None) -> int | None:
        """Emit and forward ``tokens`` (after ``tail``, a token already emitted), the picks of all
        but the last unused; the last one's pick, within ``allowed``, comes back (None: cut)."""
        run = ([tail] if tail is not None else []) + tokens
        picked: int | None = None
        for index, token in enumerate(run):
            if tail is None or index:
                self._emit(reply, token)
            last = index == len(run) - 1
            picked = self._forward_call_token(request, turn, reply, token, allowed if last else None)
            if picked is None:
                return None
        return picked

    def _emit(self, reply: ReplyState, token: int) -> None:
        """A call token joins the reply (it shows no text: a call is never spoken)."""
        reply.ids.append(token)
        reply.ends.append(len(reply.text))

    def _forward_call_token(self, request: ThinkRequest, turn: int, reply: ReplyState, token: int,
                            allowed: Any) -> int | None:
        """Forward one call token; returns the next token, picked within ``allowed`` (with None,
        a forced token follows: the pick is not used and -1 comes back), or None when the reply
        was cut meanwhile."""
        import torch

        with self.lock:
            if not self._alive(turn, request):
                return None
            if self.rows is not None:
                if allowed is not None:
                    self.rows.state.restrict(self.rows.slot, allowed)
                picked, _vec = self._next_batched(token, forwards=1)
            else:
                logits, _vec = self._step(token)
                picked = -1
                if allowed is not None:
                    history = torch.tensor([self.ctx.ids], dtype=torch.long)
                    keep = torch.as_tensor(allowed, dtype=torch.bool, device=logits.device)
                    picked = self._sampler(logits.masked_fill(~keep, -float("inf")), history)
            reply.forwarded += 1
            reply.record.end = len(self.ctx)
        return int(picked) if allowed is not None else -1


#: calls one reply may make (a model that keeps calling is stopped there)
MAX_CALLS = 8


def _calls_fingerprint(calls: list[ToolCall]) -> tuple:
    """A reply of one call reads as the conversation's ``function_call`` item renders; a reply of
    several matches no message (the items render one assistant turn each), so the next turn
    evaluates them again from where the reply began."""
    if len(calls) == 1:
        return fingerprint(TurnMessage(role="assistant", call=calls[0]))
    return ("assistant", "calls", tuple((c.name, c.arguments) for c in calls))


def _only(tools: Any, *ids: int) -> Any:
    import numpy as np

    mask = np.zeros((tools.vocab,), dtype=bool)
    mask[list(ids)] = True
    return mask


def ban_ids(logits: Any, banned: list[int]) -> Any:
    import torch

    if not banned:
        return logits
    return logits.index_fill(-1, to_device(torch.tensor(banned), logits.device), -float("inf"))
