"""One error shape for every HTTP refusal: ``{"error": {"type", "code", "message", "param"}}``.

FastAPI's own answers (``{"detail": ...}`` for a failed validation, a 404, a 405) and unexpected
exceptions are turned into this shape too, so a client never sees framework internals.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError, WebSocketRequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from ..protocol.errors import ErrorCode
from ..security import AuthError
from .bodies import BodyTooLarge, InvalidJSON

#: how much of a validation message is echoed back (pydantic messages are short; inputs never are)
_MAX_MESSAGE = 300
_STATUS_CODES = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}


class ApiError(Exception):
    """A refusal raised by a dependency or an endpoint, answered in the project's shape."""

    def __init__(self, status: int, code: ErrorCode, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param


def api_error(status: int, code: ErrorCode, message: str, param: str | None = None,
              headers: dict[str, str] | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"type": kind, "code": code, "message": message, "param": param}}
    return JSONResponse(body, status_code=status, headers=headers)


def _param(loc: tuple[Any, ...]) -> str | None:
    # ("body", "expires_after", "seconds") -> "expires_after.seconds"; the source is implied
    parts = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "query", "path", "header") else [str(p) for p in loc]
    return ".".join(parts)[:_MAX_MESSAGE] or None


def validation_error(errors: list[Any]) -> JSONResponse:
    """The first failed check, by location and pydantic's message (never the input itself)."""
    first = errors[0] if errors else {}
    param = _param(tuple(first.get("loc", ())))
    message = str(first.get("msg", "the request is invalid"))[:_MAX_MESSAGE]
    return api_error(422, ErrorCode.INVALID_VALUE, f"{param}: {message}" if param else message, param)


async def _on_api_error(conn: HTTPConnection, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return api_error(exc.status, exc.code, exc.message, exc.param)


async def _on_auth_error(conn: HTTPConnection, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthError)
    return api_error(exc.status, exc.code, exc.message)


async def _on_too_large(conn: HTTPConnection, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BodyTooLarge)
    return api_error(413, exc.code, str(exc))


async def _on_invalid_json(conn: HTTPConnection, exc: Exception) -> JSONResponse:
    return api_error(400, ErrorCode.INVALID_JSON, str(exc)[:_MAX_MESSAGE])


async def _on_validation(conn: HTTPConnection, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError | WebSocketRequestValidationError)
    return validation_error(list(exc.errors()))


async def _on_http_exception(conn: HTTPConnection, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = _STATUS_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
    return api_error(exc.status_code, code, str(exc.detail)[:_MAX_MESSAGE], headers=dict(exc.headers or {}))


async def _on_unexpected(conn: HTTPConnection, exc: Exception) -> JSONResponse:
    # Starlette re-raises after this answer, so the server logs the traceback (once, server-side)
    return api_error(500, ErrorCode.SERVER_ERROR, "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(AuthError, _on_auth_error)
    app.add_exception_handler(BodyTooLarge, _on_too_large)
    app.add_exception_handler(InvalidJSON, _on_invalid_json)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(WebSocketRequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unexpected)
