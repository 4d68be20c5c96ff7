"""The body of ``POST /v1/realtime/calls``: an SDP offer (``application/sdp``) or a
``multipart/form-data`` form with ``sdp`` and an optional ``session`` JSON object; checked for
what a call needs before a session is opened for it."""

from __future__ import annotations

from email import policy
from email.parser import BytesParser
from typing import Any

from aiortc import sdp as aiortc_sdp

from ...protocol import strict_json
from ...protocol.errors import ErrorCode


class BadOffer(Exception):
    """The offer cannot become a call (answered 4xx with ``code``; no session was opened)."""

    def __init__(self, code: ErrorCode, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.status = code, message, param, status


def parse_body(content_type: str, body: bytes) -> tuple[str, dict[str, Any] | None]:
    """(offer SDP, session object or None) from either request shape."""
    media_type = content_type.split(";")[0].strip().lower()
    if media_type == "multipart/form-data":
        message = BytesParser(policy=policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        )
        if not message.is_multipart():
            raise BadOffer(ErrorCode.INVALID_MULTIPART, "malformed multipart/form-data body")
        fields: dict[str, bytes] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if isinstance(name, str):
                fields[name] = part.get_payload(decode=True) or b""
        if "sdp" not in fields:
            raise BadOffer(ErrorCode.MISSING_SDP, "multipart body has no 'sdp' field", param="sdp")
        sdp_text = fields["sdp"].decode("utf-8", "replace")
        session = None
        if fields.get("session"):
            try:
                session = strict_json.loads(fields["session"])
            except ValueError as exc:
                raise BadOffer(ErrorCode.INVALID_SESSION, f"'session' is not valid JSON: {exc}", param="session") from None
            if not isinstance(session, dict):
                raise BadOffer(ErrorCode.INVALID_SESSION, "'session' must be a JSON object", param="session")
        return sdp_text, session
    if media_type in ("application/sdp", "text/plain", ""):
        return body.decode("utf-8", "replace"), None
    raise BadOffer(
        ErrorCode.UNSUPPORTED_MEDIA_TYPE, f"send the SDP offer as application/sdp or multipart/form-data, not {media_type!r}",
        status=415,
    )


def check_offer(sdp_text: str) -> None:
    """Refuse what can never become a call, before a session is opened for it."""
    if not sdp_text.lstrip().startswith("v=0"):
        raise BadOffer(ErrorCode.INVALID_SDP, "the body is not an SDP offer (it must start with v=0)", param="sdp")
    try:
        description = aiortc_sdp.SessionDescription.parse(sdp_text)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the client's
        raise BadOffer(ErrorCode.INVALID_SDP, f"the SDP offer could not be parsed: {exc}", param="sdp") from None
    kinds = [m.kind for m in description.media]
    if "audio" not in kinds:
        raise BadOffer(ErrorCode.MISSING_AUDIO, "the offer has no audio m-line; add an audio transceiver", param="sdp")
    if "application" not in kinds:
        raise BadOffer(
            ErrorCode.MISSING_DATA_CHANNEL, "the offer has no data channel; create the 'oai-events' data channel before the offer",
            param="sdp",
        )
    for media in description.media:
        if not (media.ice and media.ice.usernameFragment and media.ice.password):
            raise BadOffer(ErrorCode.INVALID_SDP, f"the {media.kind} m-line has no ICE credentials", param="sdp")
        if not (media.dtls and media.dtls.fingerprints):
            raise BadOffer(ErrorCode.INVALID_SDP, f"the {media.kind} m-line has no DTLS fingerprint", param="sdp")
