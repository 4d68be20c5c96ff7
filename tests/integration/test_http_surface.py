"""The HTTP surface under hostile input: who may call each route, the one error shape, bodies
refused before they are read, the keyed OpenAPI document.

Real servers on loopback serving the echo model; hand-written requests where httpx would refuse
to send the bytes (a lying length, non-ASCII headers, a chunked body that never ends).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
import websockets
from fastapi.routing import APIRoute

from realtime_omni.endpoints import MAX_SECRET_REQUEST_BYTES
from realtime_omni.engines.registry import ModelRegistry
from tests.helpers import raw_http
from tests.server import ServerThread

pytestmark = pytest.mark.asyncio(loop_scope="session")
KEY = {"Authorization": "Bearer sk-test"}
ORIGIN = "http://good.example"


@pytest.fixture(scope="module")
def echo_registry() -> Iterator[ModelRegistry]:
    registry = ModelRegistry()
    registry.load(["echo"])
    yield registry
    registry.close()


class _Boom(RuntimeError):
    pass


async def _boom() -> None:
    raise _Boom("secret internals: /etc/shadow at 0xdeadbeef")


@pytest.fixture(scope="module")
def keyed(echo_registry) -> Iterator[ServerThread]:
    srv = ServerThread(echo_registry, models=["echo"], api_keys=["sk-test"], allowed_origins=[ORIGIN])
    # a route that fails the way a bug would: the real app, one more real route (before the / mount)
    srv.app.router.routes.insert(0, APIRoute("/test/boom", _boom))
    with srv:
        yield srv


@pytest.fixture(scope="module")
def open_server(echo_registry) -> Iterator[ServerThread]:
    with ServerThread(echo_registry, models=["echo"]) as srv:
        yield srv


def _error(reply: httpx.Response) -> dict:
    body = reply.json()
    assert set(body) == {"error"}, body  # the project's shape, never FastAPI's {"detail": ...}
    assert set(body["error"]) == {"type", "code", "message", "param"}, body
    return body["error"]


# ------------------------------------------------------------------------------------ OpenAPI
async def test_openapi_and_docs_need_the_key_when_keys_are_set(keyed):
    async with httpx.AsyncClient(base_url=keyed.http, timeout=10) as http:
        for path in ("/openapi.json", "/docs"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sk-test"}):
                reply = await http.get(path, headers=headers)
                assert reply.status_code == 401 and _error(reply)["code"] == "invalid_api_key", (path, headers)
        document = (await http.get("/openapi.json", headers=KEY)).json()
        docs = await http.get("/docs", headers=KEY)
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    assert {"/v1/models", "/v1/realtime/client_secrets", "/v1/realtime/calls", "/metrics"} <= set(document["paths"])
    # bodies read by dependencies are still described, and every $ref resolves
    schemas = document["components"]["schemas"]
    body = document["paths"]["/v1/realtime/client_secrets"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["$ref"] == "#/components/schemas/ClientSecretRequest"
    refs = {r.rsplit("/", 1)[1] for r in _refs(document)}
    assert refs <= set(schemas), refs - set(schemas)
    assert {"ClientSecretRequest", "ExpiresAfter", "ModelList", "CallList", "ErrorResponse"} <= set(schemas)
    assert "multipart/form-data" in document["paths"]["/v1/realtime/calls"]["post"]["requestBody"]["content"]
    # refusals are documented in the shape they are sent in, not FastAPI's default {"detail": [...]}
    assert "HTTPValidationError" not in json.dumps(document)
    calls_422 = document["paths"]["/v1/realtime/calls/{call_id}"]["get"]["responses"]["422"]
    assert calls_422["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    # the docs routes do not describe themselves
    assert "/openapi.json" not in document["paths"] and "/docs" not in document["paths"]


def _refs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


async def test_openapi_is_open_when_no_keys_are_set(open_server):
    async with httpx.AsyncClient(base_url=open_server.http, timeout=10) as http:
        reply = await http.get("/openapi.json")
    assert reply.status_code == 200 and reply.json()["info"]["title"] == "realtime-omni"


# ---------------------------------------------------------------------------- /metrics, /ready
async def test_metrics_need_the_key_when_keys_are_set(keyed):
    async with httpx.AsyncClient(base_url=keyed.http, timeout=10) as http:
        refused = await http.get("/metrics")
        wrong = await http.get("/metrics", headers={"Authorization": "Bearer sk-tes"})
        allowed = await http.get("/metrics", headers=KEY)
    assert refused.status_code == 401 and _error(refused)["code"] == "invalid_api_key"
    assert "realtime_omni" not in refused.text
    assert wrong.status_code == 401
    assert allowed.status_code == 200 and "realtime_omni_sessions_active" in allowed.text


async def test_metrics_public_opens_metrics_and_nothing_else(echo_registry):
    with ServerThread(echo_registry, models=["echo"], api_keys=["sk-test"], metrics_public=True) as srv:
        async with httpx.AsyncClient(base_url=srv.http, timeout=10) as http:
            metrics = await http.get("/metrics")
            models = await http.get("/v1/models")
    assert metrics.status_code == 200 and "realtime_omni_sessions_active" in metrics.text
    assert models.status_code == 401


async def test_ready_shows_only_its_status_without_a_key(keyed, open_server):
    async with httpx.AsyncClient(timeout=10) as http:
        anonymous = await http.get(f"{keyed.http}/ready", headers={"Authorization": "Bearer wrong"})
        holder = await http.get(f"{keyed.http}/ready", headers=KEY)
        unkeyed = await http.get(f"{open_server.http}/ready")
        health = await http.get(f"{keyed.http}/health", headers={"Origin": "http://evil.example"})
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "ready"}
    assert holder.json()["models"] == ["echo"] and holder.json()["sessions"] == 0
    assert unkeyed.json()["models"] == ["echo"] and "worker_restarts" in unkeyed.json()
    assert health.status_code == 200 and health.json()["status"] == "ok"  # liveness is never refused


async def test_probes_may_use_head(keyed):
    async with httpx.AsyncClient(base_url=keyed.http, timeout=10) as http:
        for path in ("/health", "/ready"):
            reply = await http.head(path)
            assert reply.status_code == 200 and reply.content == b"", path


# ----------------------------------------------------------------------------- auth and Origin
async def test_non_ascii_authorization_is_a_401_on_every_keyed_route(keyed):
    for method, path in (("GET", "/metrics"), ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/v1/models"),
                         ("GET", "/v1/realtime/calls/rtc_x"), ("DELETE", "/v1/realtime/calls/rtc_x"),
                         ("POST", "/v1/realtime/calls")):
        status, rest = await raw_http(keyed.http, f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                                  "Authorization: Bearer sk-t\xe9st\xff\r\nConnection: close")
        assert status == 401 and b"invalid_api_key" in rest, (path, status, rest[:300])
    # the WebSocket handshake: refused with the same JSON body, not a 500 or a dropped socket
    status, rest = await raw_http(keyed.http, "GET /v1/realtime?model=echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                              "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                              "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer \xff\xfe\xe9")
    assert status == 401 and b"invalid_api_key" in rest, rest[:300]


async def test_a_foreign_origin_is_refused_on_every_keyed_route(keyed):
    headers = {**KEY, "Origin": "http://evil.example"}
    async with httpx.AsyncClient(base_url=keyed.http, timeout=10) as http:
        for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/openapi.json"),
                             ("GET", "/v1/realtime/calls"), ("GET", "/v1/realtime/ice"),
                             ("POST", "/v1/realtime/client_secrets"), ("POST", "/v1/realtime/calls")):
            reply = await http.request(method, path, headers=headers)
            assert reply.status_code == 403 and _error(reply)["code"] == "origin_not_allowed", (method, path)
        allowed = await http.get("/v1/models", headers={**KEY, "Origin": ORIGIN})
    assert allowed.status_code == 200
    with pytest.raises(websockets.InvalidStatus) as info:
        await websockets.connect(f"{keyed.ws}/v1/realtime?model=echo", additional_headers=headers)
    assert info.value.response.status_code == 403
    assert json.loads(info.value.response.body)["error"]["code"] == "origin_not_allowed"


# ------------------------------------------------------------------------ validation and errors
async def test_validation_errors_come_back_in_the_project_shape(keyed):
    async with httpx.AsyncClient(base_url=keyed.http, timeout=10, headers=KEY) as http:
        cases = [
            ({"expires_after": {"seconds": "soon"}}, "expires_after.seconds"),
            ({"expires_after": {"anchor": "updated_at", "seconds": 60}}, "expires_after.anchor"),
            ({"session": [1, 2]}, "session"),
            ({"expires_after": 5}, "expires_after"),
        ]
        for body, param in cases:
            reply = await http.post("/v1/realtime/client_secrets", json=body)
            error = _error(reply)
            assert reply.status_code == 422 and error["code"] == "invalid_value" and error["param"] == param, reply.text
            assert "soon" not in error["message"] and "Traceback" not in reply.text
        # FastAPI's own query and path validation, in the same shape
        seq = await http.post("/v1/realtime/calls?resume_token=x&last_sequence_number=-1",
                              content=b"v=0\r\n", headers={"Content-Type": "application/sdp"})
        assert seq.status_code == 422 and _error(seq)["param"] == "last_sequence_number"
        long_id = await http.get("/v1/realtime/calls/" + "x" * 5000)
        assert long_id.status_code == 422 and _error(long_id)["param"] == "call_id"
        assert "x" * 100 not in long_id.text  # the input is not echoed
        missing = await http.get("/v1/no/such/route")
        assert missing.status_code == 404 and _error(missing)["code"] == "not_found"


async def test_hostile_json_is_a_400_with_a_code(keyed):
    bodies = ["[" * 100_000 + "]" * 100_000, '{"a":' * 40 + "1" + "}" * 40, '{"expires_after": {"seconds": Infinity}}',
              '{"expires_after": {"seconds": -Infinity}}', '{"session": {"temperature": NaN}}', "[1, 2]", '"text"',
              "{", b"\xff\xfe{}"]
    async with httpx.AsyncClient(base_url=keyed.http, timeout=30, headers=KEY) as http:
        for body in bodies:
            reply = await http.post("/v1/realtime/client_secrets", content=body)
            assert reply.status_code == 400 and _error(reply)["code"] == "invalid_json", (str(body)[:40], reply.text)
        # a WebRTC offer's multipart session is strict JSON too
        form = {"sdp": (None, "v=0\r\n"), "session": (None, '{"type": "realtime", "temperature": NaN}')}
        reply = await http.post("/v1/realtime/calls?model=echo", files=form)
        assert reply.status_code == 400 and _error(reply)["code"] == "invalid_session"


async def test_an_unexpected_error_is_a_500_without_internals(keyed):
    async with httpx.AsyncClient(base_url=keyed.http, timeout=10) as http:
        reply = await http.get("/test/boom")
    assert reply.status_code == 500
    error = _error(reply)
    assert error["code"] == "server_error" and error["type"] == "server_error"
    assert "internals" not in reply.text and "_Boom" not in reply.text and "Traceback" not in reply.text


# ------------------------------------------------------------------------------- body limits
async def test_an_announced_oversize_body_is_refused_unread(keyed):
    # 1 GiB announced, not a byte of it sent: the answer comes at once
    status, rest = await raw_http(keyed.http, "POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: x\r\n"
                              "Authorization: Bearer sk-test\r\nContent-Type: application/json\r\n"
                              f"Content-Length: {2**30}")
    assert status == 413 and json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("path,code", [("/v1/realtime/client_secrets", "request_too_large"),
                                       ("/v1/realtime/calls?model=echo", "offer_too_large")])
async def test_a_chunked_body_is_refused_at_the_limit_not_at_its_end(keyed, path, code):
    """A chunked body that goes past the limit and then never ends: the server answers 413 while
    it is still open, so it did not wait for (or hold) the rest."""
    url = urlsplit(keyed.http)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        piece = b"x" * 65536
        for _ in range(MAX_SECRET_REQUEST_BYTES // len(piece) + 2):  # past both limits (1 MiB, 256 KiB)
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()  # no terminating 0-chunk: the body is still open
        status_line = await asyncio.wait_for(reader.readline(), 10)
        rest = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
    assert int(status_line.split()[1]) == 413
    assert code.encode() in rest


async def test_the_key_is_checked_before_the_body_is_read(keyed):
    # no key and 1 GiB announced: a 401 (the caller learns nothing about limits and nothing is read)
    status, rest = await raw_http(keyed.http, "POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: x\r\n"
                              f"Content-Type: application/json\r\nContent-Length: {2**30}")
    assert status == 401 and b"invalid_api_key" in rest


# ------------------------------------------------------------------------- telephony webhook
async def test_the_twilio_webhook_is_refused_in_the_project_shape(keyed):
    from pydantic import SecretStr

    voice = f"{keyed.http}/v1/telephony/twilio/voice"
    twilio = keyed.app.state.settings.transports.twilio
    async with httpx.AsyncClient(timeout=10) as http:
        # keys on and no Twilio token: no webhook can be trusted
        unconfigured = await http.post(voice, data={"CallSid": "CA1"})
        assert unconfigured.status_code == 403 and _error(unconfigured)["code"] == "telephony_not_configured"
        twilio.auth_token = SecretStr("secret-token")
        try:
            forged = await http.post(voice, data={"CallSid": "CA1"}, headers={"X-Twilio-Signature": "AAAA"})
            # a form past 64 KiB announced: refused unread
            status, rest = await raw_http(keyed.http, "POST /v1/telephony/twilio/voice HTTP/1.1\r\nHost: x\r\n"
                                      "Content-Type: application/x-www-form-urlencoded\r\n"
                                      f"Content-Length: {2**30}")
        finally:
            twilio.auth_token = None
        assert forged.status_code == 403 and _error(forged)["code"] == "invalid_signature"
    assert status == 413 and b"request_too_large" in rest


# ------------------------------------------------------------------------------ the openai SDK
async def test_the_openai_sdk_reads_the_typed_responses(keyed):
    from openai import AsyncOpenAI, AuthenticationError

    client = AsyncOpenAI(api_key="sk-test", base_url=f"{keyed.http}/v1", max_retries=0)
    models = await client.models.list()
    assert [m.id for m in models.data] == ["echo"] and models.data[0].object == "model"
    secret = await client.realtime.client_secrets.create(
        session={"type": "realtime", "instructions": "Be brief."}, expires_after={"anchor": "created_at", "seconds": 60})
    assert secret.value.startswith("ek_") and secret.expires_at > 0
    assert secret.session.type == "realtime" and secret.session.instructions == "Be brief."
    with pytest.raises(AuthenticationError) as info:
        await AsyncOpenAI(api_key="sk-wrong", base_url=f"{keyed.http}/v1", max_retries=0).models.list()
    assert info.value.code == "invalid_api_key"  # the SDK finds the code where OpenAI puts it
