"""Server events built through the ``openai`` package's typed models.

:func:`server_event` validates the fields against the SDK's model of that event type, so an
event the server sends cannot drift from the published schema; the session core adds the
``event_id`` when it emits the event.
"""

from __future__ import annotations

import typing
from typing import Any

import pydantic
from openai.types.realtime import RealtimeServerEvent

_MODELS: dict[str, type[pydantic.BaseModel]] = {
    typing.get_args(model.model_fields["type"].annotation)[0]: model
    for model in typing.get_args(typing.get_args(RealtimeServerEvent)[0])
}


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    """The event ``kind`` with ``fields``, checked by the SDK's model (raises if they do not fit)."""
    model = _MODELS[kind].model_validate({"event_id": "", "type": kind, **fields})
    return model.model_dump(mode="json", exclude={"event_id"}, exclude_unset=True)
