"""Function calls on the omni engine (tiny random Qwen2.5-Omni / Qwen3-Omni checkpoints).

The random thinker cannot choose a function by meaning; what is tested is the machinery: the
Qwen call tokens, the grammar holding every argument to its schema, a call never reaching the
talker, the call kept in the session's cache exactly as a fresh prefill would read it, the
batched thinker writing the same call as a session alone, and ``tool_choice`` honoured.
"""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("llguidance")

from realtime_omni.engines.base import ThinkRequest, ToolCall, ToolSpec, TurnMessage  # noqa: E402
from realtime_omni.engines.omni import OmniModel  # noqa: E402

from .test_omni import TOOL_TAGS, _one_thread, omni, request, user_audio  # noqa: E402, F401
from .test_omni_batching import pair  # noqa: E402, F401

WEATHER = ToolSpec("get_weather", "Current weather of a city", {
    "type": "object", "required": ["city", "days"],
    "properties": {"city": {"enum": ["paris", "rome", "oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}})
BOOKING = ToolSpec("book_table", "Book a table", {
    "type": "object", "required": ["guests", "note"],
    "properties": {"guests": {"type": "integer", "minimum": 1, "maximum": 12}, "note": {"type": "string", "maxLength": 12}}})
OPEN, CLOSE = TOOL_TAGS["<tool_call>"], TOOL_TAGS["</tool_call>"]


def ask(tool_choice: str = "required", tool_name: str | None = None, messages=None, max_tokens: int = 200,
        audio_seed: int = 0, parallel: bool = False) -> ThinkRequest:
    req = request(messages or [TurnMessage(role="user", audio=user_audio(1.0, seed=audio_seed))], max_tokens=max_tokens)
    req.tools, req.tool_choice, req.tool_name = [WEATHER, BOOKING], tool_choice, tool_name
    req.parallel_tool_calls = parallel
    return req


def as_the_pipeline_does(session, req: ThinkRequest) -> tuple[list, list]:
    """Think, and talk live as the server's pipeline does: call pieces go to the client, never to
    the talker; the talker is told when the reply has ended."""
    outputs, chunks = [], []
    fed = False
    for out in session.think(req):
        outputs.append(out)
        if out.call is None:
            session.talk_more([out], req.voice, final=False, first=not fed)
            fed = True
    session.talk_more([], req.voice, final=True, first=not fed)
    result: list = []
    speaker = threading.Thread(target=lambda: result.extend(session.talk_live(threading.Event())), daemon=True)
    speaker.start()
    speaker.join(60)
    assert not speaker.is_alive(), "the live talker did not finish"
    chunks.extend(result)
    return outputs, chunks


def calls_of(outputs) -> list[ToolCall]:
    """The finished calls of a reply, each checked against its tool's schema."""
    calls, streamed = [], ""
    for out in outputs:
        if out.call is None:
            continue
        streamed += out.call.delta
        if out.call.done:
            assert streamed == out.call.arguments  # the deltas add up to the arguments
            tool = {t.name: t for t in (WEATHER, BOOKING)}[out.call.name]
            jsonschema.validate(json.loads(out.call.arguments), tool.parameters)
            calls.append(ToolCall(out.call.name, out.call.arguments, f"call_{len(calls)}"))
            streamed = ""
    return calls


def reply_alone(model: OmniModel, req: ThinkRequest) -> list:
    """The reply of a new session, which evaluates the whole conversation at once."""
    session = model.open_session()
    try:
        return list(session.think(req))
    finally:
        session.close()


def call_of(outputs) -> ToolCall:
    calls = calls_of(outputs)
    assert len(calls) == 1, outputs
    return calls[0]


def test_the_model_takes_tools_where_its_vocabulary_has_the_call_tokens(omni):
    assert "tools" in omni.info.capabilities
    assert (omni.loaded.tools.open, omni.loaded.tools.close) == (OPEN, CLOSE)


@pytest.mark.parametrize("tool_name", [None, "book_table"])
def test_a_required_call_fits_its_schema_and_is_never_spoken(omni, tool_name):
    session = omni.open_session()
    try:
        list(session.think(ask("none", max_tokens=4)))  # a spoken reply before: its talker is done
        outputs, chunks = as_the_pipeline_does(session, ask("required", tool_name))
    finally:
        session.close()
    call = call_of(outputs)
    if tool_name is not None:
        assert call.name == tool_name
    assert all(o.call is not None and o.text == "" for o in outputs)  # nothing for the talker
    assert not any(c.codes is not None and len(c.codes) for c in chunks)  # and nothing spoken


def test_after_the_functions_output_the_cached_call_reads_as_a_fresh_prefill_would(omni):
    """The next turn keeps the call in the cache (only its closing, the output and the header
    are evaluated), and answers exactly as a session that evaluates the whole conversation."""
    session = omni.open_session()
    try:
        first = list(session.think(ask()))
        call = call_of(first)
        turn = [TurnMessage(role="user", audio=user_audio(1.0)), TurnMessage(role="assistant", call=call),
                TurnMessage(role="tool", text='{"temperature": 21}', tool_name=call.name)]
        kept = list(session.think(ask("auto", messages=turn, max_tokens=8)))
    finally:
        session.close()
    fresh = reply_alone(omni, ask("auto", messages=turn, max_tokens=8))
    assert [o.text for o in kept] == [o.text for o in fresh] and "".join(o.text for o in kept)
    assert kept[0].prompt_tokens == fresh[0].prompt_tokens
    output_tokens = len(omni.loaded.tokenizer.encode('<tool_response>\n{"temperature": 21}\n</tool_response>'))
    assert output_tokens < kept[0].prefilled_tokens < output_tokens + 16 < fresh[0].prefilled_tokens


def test_auto_lets_the_model_open_a_call_and_other_choices_keep_the_tags_out_of_a_reply(omni):
    """The random head is made to prefer ``<tool_call>`` as the first token: under ``auto`` the
    reply becomes a call; under ``none`` (and without tools) the tag is never picked."""
    head = omni.loaded.thinker.lm_head.weight
    saved = head[[OPEN, CLOSE]].clone()
    text = reply_alone(omni, ask("none", max_tokens=1))
    first = omni.loaded.tokenizer.encode(text[0].text)[0]
    try:
        with torch.no_grad():
            head[OPEN] = head[first] * 3  # (the first token's logit is the largest, and positive)
            head[CLOSE] = head[first] * 2
        for choice, calls in (("auto", True), ("none", False)):
            outputs = reply_alone(omni, ask(choice, max_tokens=200 if calls else 12))
            ids = [o.hidden.token_id for o in outputs if o.hidden is not None]
            if calls:
                call_of(outputs)
            else:
                assert outputs and all(o.call is None for o in outputs)
                assert OPEN not in ids and CLOSE not in ids
    finally:
        with torch.no_grad():
            head[[OPEN, CLOSE]] = saved


def test_a_named_tool_the_session_lacks_fails_the_reply_cleanly(omni):
    session = omni.open_session()
    try:
        with pytest.raises(ValueError, match="not among"):
            list(session.think(ask("required", "no_such_tool")))
        assert "".join(o.text for o in session.think(ask("none", max_tokens=3)))  # the session goes on
    finally:
        session.close()


def test_batched_sessions_write_the_same_calls_as_sessions_alone_while_others_speak(pair):
    batched, alone = pair["batched"], pair["alone"]

    def converse(model: OmniModel, i: int) -> list:
        session = model.open_session()
        try:
            if i == 2:  # a spoken reply beside the calls
                return [o.text for o in session.think(ask("none", max_tokens=16, audio_seed=i))]
            outputs = list(session.think(ask("required", "book_table" if i else None, audio_seed=i, parallel=i == 1)))
            return calls_of(outputs)
        finally:
            session.close()

    expected = {i: converse(alone, i) for i in range(3)}
    results, errors = {}, []

    def run(i: int) -> None:
        try:
            results[i] = converse(batched, i)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(300)
    assert not errors, errors
    assert results == expected and len(expected[0]) == 1 and len(expected[1]) > 1


def test_parallel_calls_follow_one_another_and_the_next_turn_reads_them_as_a_fresh_prefill(omni):
    """The tiny head scores a newline and the end of the turn alike, so after each call the
    model goes on to the next (the newline's id is the lower): several calls in one reply, each
    to its schema, up to the reply's budget. The next turn re-reads them as the conversation's
    items render (one assistant turn per call) and answers as a fresh session does."""
    session = omni.open_session()
    try:
        first = list(session.think(ask("required", parallel=True, max_tokens=240)))
        calls = calls_of(first)
        assert len(calls) >= 2, first
        turn = [TurnMessage(role="user", audio=user_audio(1.0))]
        turn += [TurnMessage(role="assistant", call=call) for call in calls]
        turn += [TurnMessage(role="tool", text=f"result {i}", tool_name=c.name) for i, c in enumerate(calls)]
        kept = list(session.think(ask("none", messages=turn, max_tokens=6)))
    finally:
        session.close()
    fresh = reply_alone(omni, ask("none", messages=turn, max_tokens=6))
    assert [o.text for o in kept] == [o.text for o in fresh]
    assert kept[0].prefilled_tokens < fresh[0].prefilled_tokens  # the user's turn stayed in the cache


def test_a_reply_makes_at_most_eight_calls(omni):
    from realtime_omni.engines.omni.thinker_calls import MAX_CALLS

    outputs = reply_alone(omni, ask("required", "get_weather", parallel=True, max_tokens=2000))
    assert len(calls_of(outputs)) == MAX_CALLS == 8
