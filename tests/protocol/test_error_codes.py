"""Error codes are one enum: every code the package writes as a literal is one of its members."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from realtime_omni.protocol import errors
from realtime_omni.protocol.errors import ErrorCode, ProtocolError

PACKAGE = Path(__file__).resolve().parents[2] / "realtime_omni"
#: callables that take an error code as a positional argument
CODE_TAKERS = {"ProtocolError", "AuthError", "BadOffer", "ApiError", "api_error", "_invalid", "error", "_error"}
CODE = re.compile(r"[a-z]+(?:_[a-z]+)+")


def literal_codes(source: str) -> set[str]:
    """The first string literal passed positionally to a code taker when it is snake case, a ``"code"`` value,
    or as a value of a dict that maps exception types to codes."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if name in CODE_TAKERS and strings and CODE.fullmatch(strings[0]):  # the code comes before message, param
                found.add(strings[0])
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if not (isinstance(value, ast.Constant) and isinstance(value.value, str) and CODE.fullmatch(value.value)):
                    continue
                if (isinstance(key, ast.Constant) and key.value == "code") or (isinstance(key, ast.Name) and key.id.endswith("Error")):
                    found.add(value.value)
    return found


def test_every_literal_error_code_in_the_package_is_an_enum_member():
    values = {code.value for code in ErrorCode}
    unknown = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        extra = literal_codes(path.read_text(encoding="utf-8")) - values
        if extra:
            unknown[str(path.relative_to(PACKAGE))] = sorted(extra)
    assert not unknown, f"error codes missing from protocol.errors.ErrorCode: {unknown}"


def test_the_scan_finds_codes_where_they_are_written():
    source = (
        'raise ProtocolError("rate_limit_exceeded", f"too many {n}")\n'
        'return _invalid(413, "request_too_large", "body too large")\n'
        'error(404, "call_not_found", f"no call {c!r}", "call_id")\n'
        'ProtocolError(code, "a message with spaces")\n'
        'x = {"type": "error", "code": "made_up_code"}\n'
        'm = {SessionLimitError: "session_limit_reached", "other": "not_a_code_key"}\n'
        'log.warning("some_thing")\n'
    )
    assert literal_codes(source) == {"rate_limit_exceeded", "request_too_large", "call_not_found", "made_up_code",
                                    "session_limit_reached"}


def test_codes_are_plain_strings_on_the_wire():
    assert errors.INVALID_JSON is ErrorCode.INVALID_JSON  # the old names are the members
    exc = ProtocolError(ErrorCode.INVALID_BASE64, "audio is not valid base64", param="audio")
    assert json.loads(json.dumps(exc.to_error()))["code"] == "invalid_base64"
    assert f"event_{ErrorCode.MODEL_NOT_FOUND}" == "event_model_not_found"
    assert len({code.value for code in ErrorCode}) == len(ErrorCode)  # no two names for one code
