"""The embedded thinker's engine, measured: SmolLM2-135M on ONNX Runtime (the project's) and,
when ``llama-cpp-python`` happens to be installed, on llama.cpp (the engine it replaced), fed the
same tokens. Writes ``docs/benchmarks/embedded-llm.{json,md}`` (and the index).

    python benchmarks/embedded_llm.py [--repeats 5]

Per engine: load time, prefill of a new conversation (system prompt + question), prefill of a
follow-up turn reusing the cached conversation, greedy decode time per token, and the memory
each extra session costs (RSS growth with 4 sessions holding ~600 tokens each). Two threads.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from realtime_omni.engines.embedded.llm import LlamaThinkerModel
from realtime_omni.engines.embedded.llm.runtime import ContextCache
from realtime_omni.engines.settings import EmbeddedSettings
from realtime_omni_bench.report import Report, command_line, write_report

QUESTIONS = ["What is the capital of France?", "How many legs does a spider have?",
             "Tell me a story about a brave little dragon.", "Who wrote Romeo and Juliet?",
             "What color is the sky on a clear day?"]
DECODE = 64
OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class OnnxEngine:
    name = "onnxruntime (project)"

    def __init__(self, shared: LlamaThinkerModel) -> None:
        self.shared = shared

    def new(self):
        return ContextCache(self.shared.runtime)

    @staticmethod
    def prefill(state, tokens: list[int]) -> None:
        state.prefill(tokens)

    @staticmethod
    def decode(state, steps: int) -> None:
        logits = state.prefill(state.tokens)  # logits of the last token (kept, not recomputed)
        for _ in range(steps):
            logits = state.extend([int(np.argmax(logits))])


class LlamaCppEngine:
    name = "llama.cpp (llama-cpp-python, before)"

    def __init__(self, path: Path, threads: int, n_ctx: int) -> None:
        import llama_cpp
        import llama_cpp.llama_cpp as llama_c

        self.llama_cpp, self.llama_c, self.path, self.threads, self.n_ctx = llama_cpp, llama_c, path, threads, n_ctx

    def new(self):
        # as the replaced engine did: no repacked "extra" buffers (AMX faults on this VM)
        original = self.llama_c.llama_model_default_params

        def params():
            p = original()
            p.use_extra_bufts = False
            return p

        self.llama_c.llama_model_default_params = params
        try:
            return self.llama_cpp.Llama(str(self.path), n_ctx=self.n_ctx, n_threads=self.threads,
                                        n_threads_batch=self.threads, n_batch=128, n_ubatch=128, verbose=False)
        finally:
            self.llama_c.llama_model_default_params = original

    @staticmethod
    def prefill(state, tokens: list[int]) -> None:
        # Llama.generate's reuse rule: keep the common prefix, evaluate the rest
        cached = list(state._input_ids)
        keep = 0
        for a, b in zip(cached, tokens):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(tokens) - 1)
        state.n_tokens = keep
        state._ctx.kv_cache_seq_rm(-1, keep, -1)
        state.eval(tokens[keep:])

    @staticmethod
    def decode(state, steps: int) -> None:
        for _ in range(steps):
            state.eval([int(np.argmax(state.scores[state.n_tokens - 1]))])


def conversation(shared: LlamaThinkerModel, question: str, reply: list[int], follow: str) -> tuple[list[int], list[int]]:
    from realtime_omni.engines.embedded.llm.thinker import DEFAULT_SYSTEM_PROMPT

    def turn(role: str, tokens: list[int]) -> list[int]:
        return shared.render_header(role) + tokens + shared.im_end + shared.newline

    system = turn("system", shared.text_tokens(DEFAULT_SYSTEM_PROMPT))
    first = system + turn("user", shared.text_tokens(question)) + shared.render_header("assistant")
    second = first + reply + shared.im_end + shared.newline + turn("user", shared.text_tokens(follow)) + \
        shared.render_header("assistant")
    return first, second


def measure(engine, shared: LlamaThinkerModel, repeats: int, load_s: float) -> dict:
    first_ms, follow_ms, decode_ms = [], [], []
    for i in range(repeats):
        question = QUESTIONS[i % len(QUESTIONS)]
        reply = shared.text_tokens("I am not sure, but I can tell you what I know about it in a few words.")
        first, second = conversation(shared, question, reply, "And why is that?")
        state = engine.new()
        start = time.perf_counter()
        engine.prefill(state, first)
        first_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        engine.decode(state, DECODE)
        decode_ms.append((time.perf_counter() - start) * 1000 / DECODE)
        engine.prefill(state, first + reply)  # the reply as the conversation will hold it
        start = time.perf_counter()
        engine.prefill(state, second)
        follow_ms.append((time.perf_counter() - start) * 1000)
        del state
        gc.collect()
    # memory per session: four sessions, each holding a long conversation
    long_prompt = (conversation(shared, " ".join(QUESTIONS * 6), [], "Go on.")[1])[:600]
    gc.collect()
    before = rss_mb()
    states = []
    for _ in range(4):
        states.append(engine.new())
        engine.prefill(states[-1], long_prompt)
    per_session = (rss_mb() - before) / 4
    del states
    gc.collect()
    return {
        "engine": engine.name, "load_s": round(load_s, 2),
        "prefill_new_ms": summary(first_ms), "prefill_follow_up_ms": summary(follow_ms),
        "decode_ms_per_token": summary(decode_ms), "rss_mb_per_session_600_tokens": round(per_session, 1),
        "prompt_tokens": {"new": len(conversation(shared, QUESTIONS[0], [], "")[0])},
    }


def summary(values: list[float]) -> dict:
    return {"p50": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2),
            "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as cold_dir:
        start = time.perf_counter()
        LlamaThinkerModel(n_threads=2, cache_dir=Path(cold_dir)).load()
        cold = time.perf_counter() - start
    start = time.perf_counter()
    shared = LlamaThinkerModel(n_threads=2, cache_dir=EmbeddedSettings().cache_dir)
    shared.load()
    results = [measure(OnnxEngine(shared), shared, args.repeats, time.perf_counter() - start)]
    results[0]["cold_build_s"] = round(cold, 2)
    with contextlib.suppress(ImportError):
        start = time.perf_counter()
        engine = LlamaCppEngine(shared.model_path, 2, 2048)
        engine.new()
        results.append(measure(engine, shared, args.repeats, time.perf_counter() - start))
    onnx = results[0]
    rows = [[r["engine"], r["load_s"], r["prefill_new_ms"]["p50"], r["prefill_follow_up_ms"]["p50"],
             r["decode_ms_per_token"]["p50"], r["rss_mb_per_session_600_tokens"]] for r in results]
    report = Report(
        name="embedded-llm", benchmark="embedded-llm",
        title="Embedded LLM engine: SmolLM2-135M on ONNX Runtime (and llama.cpp, which it replaced)",
        command=command_line(), config={"repeats": args.repeats, "decode_tokens": DECODE, "threads": 2},
        summary={"engines": results}, samples={},
        columns=["engine", "load s (graph cached)", "prefill new conversation ms", "prefill follow-up turn ms",
                 "decode ms/token", "RSS MB per session (600 tokens)"],
        rows=rows,
        headline=(f"ONNX Runtime: prefill {onnx['prefill_new_ms']['p50']} ms (new conversation), "
                  f"{onnx['prefill_follow_up_ms']['p50']} ms (follow-up), {onnx['decode_ms_per_token']['p50']} ms/token, "
                  f"{onnx['rss_mb_per_session_600_tokens']} MB per session; first start builds the graph in "
                  f"{onnx['cold_build_s']} s"),
        notes=[
            (f"Same tokens for both engines: a new conversation (system prompt + question, "
            f"{onnx['prompt_tokens']['new']} tokens), a greedy decode of {DECODE} tokens, then a follow-up turn that "
            "reuses the cached conversation. Medians over the repeats; two threads."),
            ("llama.cpp is measured only where llama-cpp-python happens to be installed (it is no longer a dependency: "
            "it compiled for 20-30 minutes at install); it ran as the replaced engine did, one instance per session."),
            ("End to end, on the same machine the same day (realtime-omni bench latency): end of speech to first audio "
            "p50 1026 ms with llama.cpp (latency-llamacpp.md) and 879 ms with ONNX Runtime (latency.md)."),
        ],
        reproduce=[command_line()],
    )
    report.duration_s = time.perf_counter() - began
    print(write_report(report, args.out)["md"])


if __name__ == "__main__":
    main()
