"""The conversation part of a session's talker prompt, kept in its talker cache between replies:
what the cache already holds is not run again (:class:`TalkerPrefix`, :func:`prefill_rows`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .graphs import StaticDecoder
from .streams import on_stream
from .loader import LoadedOmni


def prefill_rows(loaded: LoadedOmni, forward: Callable[..., Any], decoder: StaticDecoder, rows: Any, inputs: Any,
                 positions: Any, context_rows: int, prefix: TalkerPrefix,
                 prepared_since: float | None = None, speaks: bool = False) -> tuple[Any, int]:
    """Run ``inputs`` (n, D) at ``positions`` (3, n) into a session's talker cache (its own, or
    its slot in the batched talker when ``rows`` is given), skipping the leading context rows
    the cache already holds (under the session's step lock); ``forward``: the architecture's
    :meth:`TalkerStream.forward`; ``prepared_since``: when the prompt's preparation began (the
    batched prefill times it); ``speaks``: a reply's own prompt, whose first audio follows (the
    batched prefill names the slot to what comes next, see ``PrefillBatcher.on_finished``).
    Returns the last row's outputs (Qwen2.5: logits; Qwen3: hidden state and logits) and the rows
    run."""
    context = inputs[:context_rows]
    keep = prefix.reusable(context, positions[:, :context_rows], decoder.write_position()) if context_rows else 0
    n = inputs.shape[0] - keep
    with on_stream(loaded.stream("talker")):
        decoder.crop(keep)
        if rows is None:
            out = forward(loaded, decoder, inputs[None, keep:], positions[:, keep:])
        else:
            # with the other sessions' talker prefills starting now, in one forward pass
            hidden, logits = rows.prefill.prefill(inputs[keep:], positions[:, keep:], {}, rows.slot, keep,
                                                  prepared_since, then=rows.slot if speaks else None)
            decoder.advance(n)
            out = logits if loaded.arch == "qwen2_5_omni" else (hidden, logits)
    if context_rows:
        prefix.remember(context, positions[:, :context_rows])
    else:
        prefix.forget()
    return out, n


class TalkerPrefix:
    """The context part of a session's talker prompt, kept in its talker cache between replies.

    A talker prompt is the conversation (Qwen2.5: every thinker token; Qwen3: the user turns'
    tokens) followed by a few reply-specific rows (the assistant header, the speaker, the first
    reply token). The conversation part only grows from one reply to the next, so the rows that
    match what the cache already holds (same input vectors at the same positions) are not run
    again: a reply runs its new context rows and its own rows, and a turn prefilled ahead of its
    reply (:meth:`OmniTalker.prefill_ahead`) leaves only the reply's rows.
    """

    def __init__(self) -> None:
        self.inputs: Any = None  # (n, D) on the device
        self.positions: Any = None  # (3, n) on the host

    def reusable(self, inputs: Any, positions: Any, cached: int) -> int:
        """How many leading rows of ``inputs`` / ``positions`` the cache holds already
        (``cached``: the rows the cache has now; rows past it were cut)."""
        import torch

        if self.inputs is None:
            return 0
        n = min(len(self.inputs), len(inputs), cached)
        if n <= 0:
            return 0
        same = (self.inputs[:n] == inputs[:n]).all(-1).cpu() & (self.positions[:, :n] == positions[:, :n].cpu()).all(0)
        differ = torch.nonzero(~same)
        return int(differ[0, 0]) if len(differ) else n

    def remember(self, inputs: Any, positions: Any) -> None:
        self.inputs, self.positions = inputs, positions.cpu()

    def forget(self) -> None:
        self.inputs = self.positions = None
