"""HTTP request bodies read with a size limit checked before (and while) reading them.

``await request.body()`` reads everything into memory first: a 512 MiB POST took the server to
2.9 GB. Here a declared ``Content-Length`` over the limit is refused unread, and a body without
one (chunked) is read only up to the limit. Endpoints take their body through the dependencies
below (never a FastAPI body parameter, which reads it whole and before the caller is checked),
so the key is checked first and the body is read second.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import pydantic
from fastapi.exceptions import RequestValidationError
from starlette.requests import Request

from ..protocol import strict_json
from ..protocol.errors import ErrorCode

M = TypeVar("M", bound=pydantic.BaseModel)


class BodyTooLarge(Exception):
    def __init__(self, limit: int, code: ErrorCode = ErrorCode.REQUEST_TOO_LARGE) -> None:
        super().__init__(f"the request body exceeds {limit} bytes")
        self.limit, self.code = limit, code


class InvalidJSON(ValueError):
    """The body is not strict JSON, or not an object (answered 400 ``invalid_json``)."""


async def read_body(request: Request, limit: int, code: ErrorCode = ErrorCode.REQUEST_TOO_LARGE) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise BodyTooLarge(limit, code)
        except ValueError:
            pass  # a malformed length: the server's HTTP parser has the last word, the cap still holds
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, code)
        chunks.append(chunk)
    return b"".join(chunks)


class LimitedBody:
    """Dependency: the raw body, at most ``limit`` bytes (413 with ``code`` past it)."""

    def __init__(self, limit: int, code: ErrorCode = ErrorCode.REQUEST_TOO_LARGE) -> None:
        self.limit, self.code = limit, code

    async def __call__(self, request: Request) -> bytes:
        return await read_body(request, self.limit, self.code)


class JsonBody(Generic[M]):
    """Dependency: the body as ``model``, parsed as strict JSON (no NaN/Infinity, bounded depth).

    Not JSON, or not an object: :class:`InvalidJSON` (400). Valid JSON of the wrong shape:
    FastAPI's ``RequestValidationError`` (422), in the same shape as its own validation.
    An empty body is an empty object.
    """

    def __init__(self, model: type[M], limit: int) -> None:
        self.model, self.limit = model, limit

    async def __call__(self, request: Request) -> M:
        raw = await read_body(request, self.limit)
        try:
            value = strict_json.loads(raw) if raw.strip() else {}
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidJSON(f"the body is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise InvalidJSON("the body must be a JSON object")
        try:
            return self.model.model_validate(value)
        except pydantic.ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False, include_context=False)
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None
