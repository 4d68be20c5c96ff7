"""Whisper's short encoder window against its full 30 s window, on spoken questions.

    PYTHONPATH=. python benchmarks/asr_window.py [--rates 1.0 0.8 1.3] [--noise 0 0.01 0.03] [--out docs/benchmarks]

Each question is spoken by the embedded Piper voice at each speaking rate, framed by 0.3 s of
silence before and 0.5 s after (a turn as the server VAD cuts it), with white noise at each level
(standard deviation as a fraction of full scale), and transcribed twice by the same Whisper tiny.en:
in the shortest window that holds it (``WhisperASR``'s default) and in the full window. Time: wall
time of one ``transcribe`` call, one at a time, on this machine's cores.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from realtime_omni.audio.resample import resample_once
from realtime_omni.engines.embedded.asr_whisper import WhisperASR
from realtime_omni.engines.embedded.tts_piper import PiperTTS
from realtime_omni_bench.report import Report, command_line, percentile, write_report
from realtime_omni_bench.wer import word_errors, words

QUESTIONS = [
    "How many legs does a spider have?", "Tell me a story about a brave little dragon.",
    "Sorry, actually, what is your name?", "Who wrote Romeo and Juliet?",
    "Describe a walk through a forest in autumn.", "What is the weather like in Paris today?",
    "Please book a table for two at 730 tomorrow evening at the Italian place near the station.",
    "Hold on. Is it going to rain today?", "What is the capital of France?",
    "Can you name a fruit that is yellow?", "Explain how a rainbow forms in the sky.",
    "What is the opposite of hot?", "Yes.", "No, thanks.", "Okay, go on.", "Set a timer for 10 minutes.",
    "Call my mother on her mobile phone.",
    "I would like to order a large pepperoni pizza with extra cheese and a bottle of water, please.",
    "What's the square root of 144?", "Translate good morning into Spanish.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1.0, 0.8, 1.3], help="Piper speaking rates")
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.01, 0.03])
    parser.add_argument("--threads", type=int, default=2, help="Whisper CPU threads")
    parser.add_argument("--name", default="asr-window")
    parser.add_argument("--out", default="docs/benchmarks")
    args = parser.parse_args()
    began = time.perf_counter()
    short, full = WhisperASR(cpu_threads=args.threads), WhisperASR(cpu_threads=args.threads, short_windows=False)
    voice = PiperTTS(threads=args.threads)
    rng = np.random.default_rng(0)
    results = {"short": {"errors": 0, "ms": []}, "full": {"errors": 0, "ms": []}}
    samples: list[dict] = []
    total_words = 0
    for rate in args.rates:
        speech = {text: resample_once(np.concatenate(list(voice.synthesize(text, speed=rate, steady=True))),
                                      voice.sample_rate, 16_000) for text in QUESTIONS}
        for noise in args.noise:
            for text in QUESTIONS:
                voiced = np.concatenate([np.zeros(4_800), speech[text], np.zeros(8_000)])
                noisy = voiced + noise * 32_768 * rng.standard_normal(len(voiced))
                pcm = np.clip(noisy, -32_768, 32_767).astype(np.int16)
                total_words += len(words(text))
                sample = {"text": text, "rate": rate, "noise": noise}
                for name, asr in (("short", short), ("full", full)):
                    t0 = time.perf_counter()
                    heard = asr.transcribe(pcm)
                    results[name]["ms"].append(1000 * (time.perf_counter() - t0))
                    errors = word_errors(text, heard)
                    results[name]["errors"] += errors
                    sample[name] = heard
                    sample[f"errors_{name}"] = errors
                samples.append(sample)
    rows = []
    summary: dict = {"turns": len(samples), "words": total_words, "short_window_retries": short.retried}
    for name in ("short", "full"):
        ms, errors = results[name]["ms"], results[name]["errors"]
        wer = round(100 * errors / total_words, 1)
        summary[name] = {"wer_pct": wer, "ms_mean": round(statistics.mean(ms), 1),
                         "ms_p50": round(percentile(ms, 50), 1), "ms_p95": round(percentile(ms, 95), 1)}
        rows.append([name, wer, summary[name]["ms_mean"], summary[name]["ms_p50"], summary[name]["ms_p95"]])
    s, f = summary["short"], summary["full"]
    report = Report(
        name=args.name, benchmark="asr_window",
        title="Whisper in a short encoder window: word errors and time per turn",
        command=command_line(),
        config={"rates": args.rates, "noise": args.noise, "questions": len(QUESTIONS), "whisper_threads": args.threads,
                "asr": "faster-whisper tiny.en int8, beam 1"},
        summary=summary, samples={"transcripts": samples},
        columns=["window", "WER (%)", "ms mean", "ms p50", "ms p95"], rows=rows,
        headline=(f"a turn transcribed in {s['ms_p50']:.0f} ms p50 instead of {f['ms_p50']:.0f} ms; "
                  f"WER {s['wer_pct']}% against {f['wer_pct']}% over {total_words} words"),
        notes=[
            "short: the speech plus at least 2 s of silence, rounded up to 10, 15, 20 or 25 s; decoded with "
            "timestamps, transcribed again in the full window when it loops or runs into its cap "
            "(short_window_retries in the JSON).",
            "Synthetic speech from one voice: the comparison on the same audio is the measurement, not the "
            "absolute error rate.",
        ],
        reproduce=[command_line()],
    )
    report.duration_s = time.perf_counter() - began
    print(write_report(report, args.out)["md"])


if __name__ == "__main__":
    main()
