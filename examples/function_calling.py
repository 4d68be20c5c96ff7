"""A voice agent's function call over the Realtime API, with the official ``openai`` SDK.

Declares a weather function, asks a question in text, runs the function the model calls, hands
its output back and prints the spoken answer's transcript.

    realtime-omni serve &
    python examples/function_calling.py "What's the weather in Paris?"
    python examples/function_calling.py "Weather in Oslo?" --auto   # let the model decide

The embedded model (SmolLM2-135M) is too small to decide to call a function on its own, so by
default the call is asked for by name (``tool_choice``); ``--auto`` shows what the model does
by itself. Against OpenAI, run it with ``--url https://api.openai.com`` and ``OPENAI_API_KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from openai import AsyncOpenAI

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def get_weather(city: str) -> dict[str, str]:
    return {"city": city, "forecast": "sunny and 31 degrees"}  # a real agent calls a service here


async def until_done(conn) -> list:  # type: ignore[no-untyped-def]
    events = []
    async for event in conn:
        events.append(event)
        if event.type == "error":
            print("error:", event.error.code, event.error.message)
        if event.type == "response.done":
            return events
    return events


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question", nargs="?", default="What's the weather in Paris?")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="gpt-realtime")
    parser.add_argument("--auto", action="store_true", help="tool_choice auto: the model decides whether to call")
    args = parser.parse_args()
    ws_url = args.url.replace("http", "ws", 1)
    client = AsyncOpenAI(api_key=os.environ.get("OPENAI_API_KEY", "local"), base_url=f"{args.url}/v1",
                         websocket_base_url=f"{ws_url}/v1")
    async with client.realtime.connect(model=args.model) as conn:
        created = await conn.recv()
        print("served by:", created.session.model)
        await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "tool_choice": "auto",
                                           "audio": {"input": {"turn_detection": None}}})
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": args.question}]})
        choice = "auto" if args.auto else {"type": "function", "name": "get_weather"}
        await conn.response.create(response={"tool_choice": choice})
        calls = [o for o in (await until_done(conn))[-1].response.output if o.type == "function_call"]
        if not calls:
            print("the model answered without calling the function")
            return
        for call in calls:
            arguments = json.loads(call.arguments)
            print(f"call {call.name}({arguments})")
            output = get_weather(**arguments)
            await conn.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                      "output": json.dumps(output)})
        await conn.response.create()
        events = await until_done(conn)
        print("answer:", "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta"))


if __name__ == "__main__":
    asyncio.run(main())
