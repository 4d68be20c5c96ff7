"""Function calling on the embedded thinker (SmolLM2-135M, ONNX Runtime): how often it calls, how
fast, and whether its answer uses the function's output. Prints a Markdown table.

    python benchmarks/tool_calls.py [--runs 10] [--e2e]

Each case is run ``--runs`` times on one session (sampling at the thinker's temperature).
``--e2e`` measures instead through a real server and the ``openai`` SDK, a new session per run:
``response.create`` (named tool) to ``function_call_arguments.done``, then the function's output
and ``response.create`` to the first audio of the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from realtime_omni.engines.base import ThinkRequest, ToolCall, ToolSpec, TurnMessage
from realtime_omni.engines.embedded.llm import LlamaThinkerModel
from realtime_omni.engines.settings import EmbeddedSettings

WEATHER = ToolSpec("get_weather", "Get the current weather for a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False})
ASKS = ["What's the weather in Paris?", "Is it raining in London right now?", "How hot is it in Rome today?"]
CHATS = ["Tell me a joke.", "Hi there!", "What is two plus two?"]
FORECAST = json.dumps({"forecast": "sunny and 31 degrees"})


def run(thinker, messages, choice, name=None, limit=60):
    request = ThinkRequest("", messages, limit, "alloy", False, tools=[WEATHER], tool_choice=choice, tool_name=name)
    start = time.perf_counter()
    first_call = None
    outs = []
    for out in thinker.think(request):
        if out.call is not None and out.call.delta and first_call is None:
            first_call = time.perf_counter() - start
        outs.append(out)
    return outs, first_call, time.perf_counter() - start


async def _e2e_runs(http: str, ws: str, runs: int) -> str:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="local", base_url=f"{http}/v1", websocket_base_url=f"{ws}/v1")
    tool = {"type": "function", "name": WEATHER.name, "description": WEATHER.description, "parameters": WEATHER.parameters}
    called, first_audio, used = [], [], 0
    for _ in range(runs):
        async with client.realtime.connect(model="gpt-realtime") as conn:
            await conn.recv()
            await conn.session.update(session={"type": "realtime", "tools": [tool],
                                               "audio": {"input": {"turn_detection": None}}})
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": ASKS[0]}]})
            start = time.perf_counter()
            await conn.response.create(response={"tool_choice": {"type": "function", "name": WEATHER.name}})
            async for event in conn:
                if event.type == "response.function_call_arguments.done":
                    called.append(time.perf_counter() - start)
                    call_id = event.call_id
                if event.type == "response.done":
                    break
            await conn.conversation.item.create(item={"type": "function_call_output", "call_id": call_id,
                                                      "output": FORECAST})
            start, first, text = time.perf_counter(), None, ""
            await conn.response.create()
            async for event in conn:
                if event.type == "response.output_audio.delta" and first is None:
                    first = time.perf_counter() - start
                    first_audio.append(first)
                if event.type == "response.output_audio_transcript.delta":
                    text += event.delta
                if event.type == "response.done":
                    break
            used += "sunny" in text.lower() or "31" in text

    def q(xs: list[float]) -> str:
        return f"p50 {1000 * statistics.median(xs):.0f} ms, max {1000 * max(xs):.0f} ms"

    return (f"| e2e, new session per run (n={runs}) | response.create → arguments.done {q(called)}; output + "
            f"response.create → first answer audio {q(first_audio)}; spoken answers using the output {used}/{runs} |")


def e2e(runs: int) -> None:
    from realtime_omni.engines.registry import ModelRegistry
    from realtime_omni.server_thread import ServerThread

    registry = ModelRegistry()
    registry.load(["embedded"])
    try:
        with ServerThread(registry, session_store="none") as server:
            row = asyncio.run(_e2e_runs(server.http, server.ws, runs))
    finally:
        registry.close()
    print("| case | result |\n|---|---|\n" + row)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--e2e", action="store_true")
    args = parser.parse_args()
    if args.e2e:
        e2e(args.runs)
        return
    runs = args.runs
    shared = LlamaThinkerModel(n_threads=2, cache_dir=EmbeddedSettings().cache_dir)
    shared.load()
    thinker = shared.open()
    rows = []

    def calls(outs):
        return [o.call for o in outs if o.call is not None]

    for label, questions in (("asks for the weather", ASKS), ("does not", CHATS)):
        n = called = 0
        for _ in range(runs):
            for q in questions:
                outs, _, _ = run(thinker, [TurnMessage("user", q)], "auto")
                n += 1
                called += bool(calls(outs))
        rows.append(f"| auto, user {label} | {called}/{n} turns called get_weather |")
    first, total, valid = [], [], 0
    for _ in range(runs):
        for q in ASKS:
            outs, t_first, t_total = run(thinker, [TurnMessage("user", q)], "required", "get_weather")
            last = calls(outs)[-1]
            valid += last.done and isinstance(json.loads(last.arguments).get("city"), str)
            first.append(t_first)
            total.append(t_total)
    rows.append(f"| named tool_choice | {valid}/{len(total)} complete calls with a string city; first argument delta after "
                f"p50 {1000 * statistics.median(first):.0f} ms, arguments done after p50 "
                f"{1000 * statistics.median(total):.0f} ms / max {1000 * max(total):.0f} ms |")
    used = recalled = 0
    history = [TurnMessage("user", ASKS[0]), TurnMessage("assistant", call=ToolCall("get_weather", '{"city": "Paris"}', "c1")),
               TurnMessage("tool", FORECAST, tool_name="get_weather")]
    for _ in range(runs):
        outs, _, _ = run(thinker, history, "auto")
        text = "".join(o.text for o in outs).lower()
        used += "sunny" in text or "31" in text
        recalled += bool(calls(outs))
    rows.append(f"| answer after function_call_output (auto) | {used}/{runs} answers use the output; "
                f"{recalled}/{runs} called again |")
    thinker.close()
    shared.close()
    print("| case | result |\n|---|---|\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
