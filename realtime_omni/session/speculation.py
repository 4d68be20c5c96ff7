"""A reply prepared during the pause before the end-of-turn decision.

When the user pauses, the runner transcribes what was said and runs the whole pipeline at once,
holding every output back. If the pause becomes the end of the turn and the response asks for
exactly what was prepared, the held outputs are released under the real response's id and
epoch and the rest streams live: first audio leaves as soon as the turn is confirmed. If the
user speaks on, or anything differs, it is dropped and nothing of it reaches the client.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ..engines.base import ThinkRequest


def same_request(a: ThinkRequest, b: ThinkRequest) -> bool:
    """Whether a prepared request answers the real one (same context, same asks)."""
    return (
        a.instructions == b.instructions
        and a.want_audio == b.want_audio
        and a.voice == b.voice
        and a.max_output_tokens == b.max_output_tokens
        and [(m.role, m.text.strip()) for m in a.messages] == [(m.role, m.text.strip()) for m in b.messages]
    )


@dataclass
class Speculation:
    spec_id: int
    transcript: asyncio.Future[str | None]
    request: ThinkRequest | None = None
    task: asyncio.Task[None] | None = None
    #: outputs held back until adoption: ("text", t) / ("audio", wire, t) / ("usage", i, o, c)
    held: list[tuple[Any, ...]] = field(default_factory=list)
    #: (status, error, reason) once the prepared pipeline finished before adoption
    finished: tuple[str, str | None, str | None] | None = None
    response_id: str | None = None
    epoch: int | None = None

    @property
    def adopted(self) -> bool:
        return self.response_id is not None

    def cancel(self) -> None:
        if self.request is not None:
            self.request.cancelled.set()
        if self.task is not None:
            self.task.cancel()
        if not self.transcript.done():
            self.transcript.cancel()
