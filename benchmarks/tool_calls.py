"""Function calling on the embedded thinker (SmolLM2-135M, llama.cpp): how often it calls, how
fast, and whether its answer uses the function's output. Prints a Markdown table.

    python benchmarks/tool_calls.py [--runs 10]

Each case is run ``--runs`` times on one session (sampling at the thinker's temperature).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from realtime_omni.engines.base import ThinkRequest, ToolCall, ToolSpec, TurnMessage
from realtime_omni.engines.embedded.llm_llama import LlamaThinkerModel

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    runs = parser.parse_args().runs
    shared = LlamaThinkerModel(n_threads=2)
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
