"""The guard's credentials: blank keys, and single-use secrets that open only what they were
minted for, within a bound on how many may be live."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from starlette.datastructures import Headers

from realtime_omni.config import AuthSection
from realtime_omni.security import MAX_SECRETS, STREAM_SECRET, AuthError, Guard


def test_a_blank_api_key_is_refused_by_the_settings_and_never_matches():
    for keys in ([""], ["k1", "  "]):
        with pytest.raises(ValidationError, match="empty or blank"):
            AuthSection(api_keys=keys)
    guard = Guard(api_keys=["sk-real"])
    guard.api_keys.append("")  # even if one got in some other way
    with pytest.raises(AuthError):
        guard.admit_owned(Headers({}), ["openai-insecure-api-key."])  # an empty key presented
    with pytest.raises(AuthError):
        guard.check_api_key(Headers({"authorization": "Bearer "}))


def test_a_session_secret_is_no_stream_token_and_a_stream_token_opens_no_session():
    guard = Guard(api_keys=["sk-real"])
    session = guard.issue_secret({"instructions": "hi"}, 60, owner="o1")
    stream = guard.issue_secret({}, 60, purpose=STREAM_SECRET)
    assert guard.redeem_secret(session.value) is False
    with pytest.raises(AuthError):
        guard.admit_owned(Headers({"authorization": f"Bearer {stream.value}"}))
    # each still works for what it was minted for (the wrong use did not spend it), once
    assert guard.admit_owned(Headers({"authorization": f"Bearer {session.value}"})) == ({"instructions": "hi"}, "o1")
    assert guard.redeem_secret(stream.value) is True and guard.redeem_secret(stream.value) is False


def test_live_secrets_are_bounded_and_spent_ones_make_room():
    guard = Guard(api_keys=["sk-real"])
    issued = [guard.issue_secret({}, 600) for _ in range(MAX_SECRETS)]
    with pytest.raises(AuthError) as info:
        guard.issue_secret({}, 600)
    assert info.value.status == 429 and info.value.code == "rate_limit_exceeded"
    guard.admit_owned(Headers({"authorization": f"Bearer {issued[0].value}"}))
    assert guard.issue_secret({}, 600).value.startswith("ek_")


def test_without_keys_or_an_origin_list_only_this_servers_and_this_machines_pages_get_in():
    """A local server without API keys: a page of any site the user visits must not drive it
    over a WebSocket (no CORS there); its own pages, pages on this machine and clients without
    an Origin (SDKs) do. With keys, or with a list, the rules stay as they were."""
    open_guard = Guard()
    for origin, host in (("http://127.0.0.1:8000", "127.0.0.1:8000"), ("http://localhost:7860", "127.0.0.1:8000"),
                         ("http://[::1]:3000", "127.0.0.1:8000"), ("http://192.168.1.5:8000", "192.168.1.5:8000")):
        open_guard.check_origin(Headers({"origin": origin, "host": host}))
    open_guard.check_origin(Headers({"host": "127.0.0.1:8000"}))  # no Origin: not a browser
    for origin in ("https://evil.example", "http://192.168.1.5:9999", "http://127.0.0.1.evil.example", "null",
                   "http://[bad"):
        with pytest.raises(AuthError) as info:
            open_guard.check_origin(Headers({"origin": origin, "host": "192.168.1.5:8000"}))
        assert info.value.status == 403
    Guard(api_keys=["sk-real"]).check_origin(Headers({"origin": "https://app.example", "host": "h"}))
    Guard(allowed_origins=["*"]).check_origin(Headers({"origin": "https://app.example", "host": "h"}))
