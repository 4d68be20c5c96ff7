"""API keys, ephemeral client secrets and the browser Origin allow-list."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers

from .protocol.errors import ErrorCode

# Browsers cannot set headers on a WebSocket; OpenAI's convention carries the key as a subprotocol.
_SUBPROTOCOL_KEY = "openai-insecure-api-key."


class AuthError(Exception):
    """A refused caller (401, or 403 for an Origin); the app answers it in the HTTP error shape."""

    def __init__(self, code: ErrorCode, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


#: what a single-use secret opens: a session (minted by a key holder for a browser) or a
#: telephony stream (put in the TwiML of a signed webhook); one is never accepted as the other
SESSION_SECRET, STREAM_SECRET = "session", "twilio_stream"
#: live secrets at most, and the bytes of the session settings they hold (a key holder minting
#: in a loop gets 429 until some expire or are used)
MAX_SECRETS = 4096
MAX_SECRET_BYTES = 64 * 1024 * 1024


@dataclass
class ClientSecret:
    value: str
    expires_at: float
    session: dict[str, Any]
    #: digest of the API key that minted it: what the secret opens belongs to that key
    owner: str | None = None
    purpose: str = SESSION_SECRET
    size: int = 0  # bytes of its session settings (JSON)


def _own_or_loopback(origin: str, host: str | None) -> bool:
    """An Origin of this server itself (same host and port as the request's Host) or of a page
    served from this machine (a loopback address or localhost)."""
    try:
        parts = urlsplit(origin)
        netloc, hostname = parts.netloc, parts.hostname or ""
    except ValueError:  # e.g. "http://[bad"
        return False
    if host is not None and netloc.lower() == host.lower():
        return True
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def key_digest(key: str) -> str:
    """What is stored of a key to tell owners apart (never the key itself)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass
class Guard:
    """Checks every HTTP request and WebSocket/WebRTC connection that opens a session."""

    api_keys: list[str] = field(default_factory=list)
    allowed_origins: list[str] | None = None
    secret_ttl_s: float = 60.0
    _secrets: dict[str, ClientSecret] = field(default_factory=dict)
    _bytes: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys)

    @staticmethod
    def presented_key(headers: Headers, subprotocols: list[str] | None = None) -> str | None:
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        for proto in subprotocols or []:
            if proto.startswith(_SUBPROTOCOL_KEY):
                return proto[len(_SUBPROTOCOL_KEY):]
        return None

    def check_origin(self, headers: Headers) -> None:
        origin = headers.get("origin")
        if origin is None:
            return  # non-browser clients send no Origin
        if self.allowed_origins is None:
            # no list: with keys, any page (it needs a key or a secret); without keys, only this
            # server's own pages and pages on this machine, so that a site the user visits
            # cannot drive a local server (a WebSocket is not held back by CORS)
            if self.enabled or _own_or_loopback(origin, headers.get("host")):
                return
            raise AuthError(ErrorCode.ORIGIN_NOT_ALLOWED, f"origin {origin!r} is not allowed: without API keys only "
                            "this server's and this machine's pages are (set auth.allowed_origins)", status=403)
        if origin not in self.allowed_origins and "*" not in self.allowed_origins:
            raise AuthError(ErrorCode.ORIGIN_NOT_ALLOWED, f"origin {origin!r} is not allowed", status=403)

    def _is_key(self, key: str | None) -> bool:
        # compared as bytes: str comparison raises on non-ASCII input (a 500, not a 401)
        return key is not None and key != "" and any(
            hmac.compare_digest(key.encode("utf-8", "surrogatepass"), k.encode()) for k in self.api_keys)

    def check_api_key(self, headers: Headers) -> str | None:
        """Endpoints that only a server-side holder of the API key may call (client secrets, the
        calls list). Returns the key's digest (None when keys are off): what it may see is its own."""
        if not self.enabled:
            return None
        key = self.presented_key(headers)
        if not self._is_key(key):
            raise AuthError(ErrorCode.INVALID_API_KEY, "a valid API key is required (Authorization: Bearer ...)")
        return key_digest(key)

    def admit(self, headers: Headers, subprotocols: list[str] | None = None) -> dict[str, Any] | None:
        """Admit a session opener. Returns the session settings bound to a client secret, if one
        was used (it is consumed: one session per secret)."""
        return self.admit_owned(headers, subprotocols)[0]

    def admit_owned(self, headers: Headers, subprotocols: list[str] | None = None
                    ) -> tuple[dict[str, Any] | None, str | None]:
        """:meth:`admit`, and the digest of the key the opener acts for (the secret's minter)."""
        self.check_origin(headers)
        key = self.presented_key(headers, subprotocols)
        if key is not None and key.startswith("ek_"):
            secret = self._take(key, SESSION_SECRET)
            if secret is None or secret.expires_at < time.time():
                raise AuthError(ErrorCode.INVALID_CLIENT_SECRET, "the client secret is unknown, used or expired")
            return secret.session, secret.owner
        if self.enabled and not self._is_key(key):
            raise AuthError(ErrorCode.INVALID_API_KEY, "a valid API key or client secret is required")
        return None, key_digest(key) if self.enabled and key is not None else None

    def redeem_secret(self, value: str) -> bool:
        """Use up a telephony stream's token (presented in the stream's start message)."""
        secret = self._take(value, STREAM_SECRET) if isinstance(value, str) and value.startswith("ek_") else None
        return secret is not None and secret.expires_at >= time.time()

    def _take(self, value: str, purpose: str) -> ClientSecret | None:
        secret = self._secrets.get(value)
        if secret is None or secret.purpose != purpose:
            return None  # a secret of the other kind stays unused: it is no credential here
        self._bytes -= secret.size
        return self._secrets.pop(value)

    def issue_secret(self, session: dict[str, Any], ttl_s: float | None = None,
                     owner: str | None = None, purpose: str = SESSION_SECRET) -> ClientSecret:
        now = time.time()
        for value in [v for v, s in self._secrets.items() if s.expires_at < now]:
            self._bytes -= self._secrets.pop(value).size  # expired secrets are swept on each issue
        size = len(json.dumps(session))
        if len(self._secrets) >= MAX_SECRETS or self._bytes + size > MAX_SECRET_BYTES:
            raise AuthError(ErrorCode.RATE_LIMIT_EXCEEDED, "too many live client secrets: use or let some "
                            "expire first", status=429)
        ttl = min(ttl_s or self.secret_ttl_s, 7200.0)
        secret = ClientSecret(value="ek_" + secrets.token_urlsafe(24), expires_at=now + ttl, session=session,
                              owner=owner, purpose=purpose, size=size)
        self._secrets[secret.value] = secret
        self._bytes += size
        return secret
