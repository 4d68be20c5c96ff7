"""Recognizer word error rate on noisy speech, without and with ``audio.input.noise_reduction``.

    PYTHONPATH=. python benchmarks/noise_reduction.py [--snr 0 5 10] [--utterances 6] [--out docs/benchmarks]

Speech: sentences spoken by the embedded Piper voice at 24 kHz (the session's pcm16 rate). Noise,
all synthesized here (no recordings): white noise; hum (50 Hz mains and its harmonics over
low-passed noise, a fan or transformer); babble (four other Piper sentences played backwards
and overlapped, speech-shaped but with no words to recognize). Each mix at each SNR (speech power
over noise power across the utterance) is transcribed by the embedded Whisper (tiny.en) as is,
and after the session's denoiser (RNNoise, fed in 20 ms chunks as a client would send them).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from realtime_omni.audio.denoise import StreamDenoiser
from realtime_omni.audio.resample import resample_once
from realtime_omni_bench.latency import synthesize_speech
from realtime_omni_bench.report import Report, command_line, write_report
from realtime_omni_bench.wer import word_errors, words

RATE = 24_000
SENTENCES = [
    "The small boat drifted slowly toward the quiet harbor at dawn.",
    "Please bring the blue folder to the meeting on the second floor.",
    "A warm breeze carried the smell of fresh bread across the street.",
    "She asked whether the train to the coast would leave on time.",
    "Turn off the lights in the kitchen before you go to bed.",
    "The children built a tall tower out of wooden blocks and glue.",
    "Our neighbor planted tomatoes and beans along the garden fence.",
    "He forgot his umbrella and walked home through the heavy rain.",
]
BABBLE = [
    "Every morning the market opens before the shops along the river.",
    "Nobody expected the concert to sell out in less than an hour.",
    "The museum will close early because of the holiday parade.",
    "Remember to water the plants while I am away for the weekend.",
]


def white(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(0.0, 1.0, n)


def hum(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n) / RATE
    tones = sum(np.sin(2 * np.pi * 50 * k * t + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 8))
    rumble = np.cumsum(rng.normal(0.0, 1.0, n))  # brown noise, high-passed below to drop the drift
    rumble -= np.convolve(rumble, np.ones(480) / 480, mode="same")
    return tones / np.std(tones) + 0.5 * rumble / np.std(rumble)


def babble_from(voices: list[np.ndarray]) -> Callable[[int, np.random.Generator], np.ndarray]:
    def babble(n: int, rng: np.random.Generator) -> np.ndarray:
        out = np.zeros(n)
        for voice in voices:
            loop = np.tile(voice[::-1].astype(np.float64), n // len(voice) + 2)
            start = int(rng.integers(0, len(voice)))
            out += loop[start:start + n]
        return out

    return babble


def mix(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    s = speech.astype(np.float64)
    noise = noise * np.sqrt(np.mean(s**2) / 10 ** (snr_db / 10) / np.mean(noise**2))
    return np.clip(np.rint(s + noise), -32768, 32767).astype(np.int16)


def denoise(pcm: np.ndarray, seconds: list[float], quality: str) -> np.ndarray:
    stream, start = StreamDenoiser(RATE, quality), time.process_time()
    parts = [stream.process(pcm[i:i + 480]) for i in range(0, len(pcm), 480)]
    parts.append(stream.process(np.zeros(RATE // 10, np.int16)))  # push the last frames through
    seconds.append(time.process_time() - start)
    return np.concatenate(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snr", type=float, nargs="+", default=[0.0, 5.0, 10.0])
    parser.add_argument("--utterances", type=int, default=8)
    parser.add_argument("--quality", default="LQ", help="soxr quality around RNNoise (the server uses LQ)")
    parser.add_argument("--noises", nargs="+", default=["white", "hum", "babble"])
    parser.add_argument("--name", default="noise-reduction")
    parser.add_argument("--threads", type=int, default=2, help="Whisper CPU threads")
    parser.add_argument("--out", default="docs/benchmarks")
    args = parser.parse_args()
    began = time.perf_counter()

    from realtime_omni.engines.embedded.asr_whisper import WhisperASR

    asr = WhisperASR(cpu_threads=args.threads)
    texts = SENTENCES[:args.utterances]
    speech = synthesize_speech(texts + BABBLE, rate=RATE)
    noises = {"white": white, "hum": hum, "babble": babble_from([speech[text] for text in BABBLE])}
    pad = np.zeros(RATE // 4, np.int16)  # a quarter second of noise alone before and after

    def errors(pcm: np.ndarray, text: str) -> tuple[int, str]:
        heard = asr.transcribe(resample_once(pcm, RATE, 16_000))
        return word_errors(text, heard), heard

    total_words = sum(len(words(t)) for t in texts)
    clean = [np.concatenate([pad, speech[t], pad]) for t in texts]
    clean_errors = sum(errors(pcm, t)[0] for pcm, t in zip(clean, texts))
    # what the denoiser's own distortion costs, with no noise to remove
    clean_denoised_errors = sum(errors(denoise(pcm, [], args.quality), t)[0] for pcm, t in zip(clean, texts))
    samples: list[dict] = []
    rows: list[list] = []
    cpu_s: list[float] = []
    audio_s = 0.0
    for noise_name in args.noises:
        make = noises[noise_name]
        for snr in args.snr:
            rng = np.random.default_rng(int(snr * 10) + len(noise_name))
            before = after = 0
            for text in texts:
                voiced = np.concatenate([pad, speech[text], pad])
                noisy = mix(voiced, make(len(voiced), rng), snr)
                cleaned = denoise(noisy, cpu_s, args.quality)
                audio_s += len(noisy) / RATE
                e_noisy, heard_noisy = errors(noisy, text)
                e_clean, heard_clean = errors(cleaned, text)
                before, after = before + e_noisy, after + e_clean
                samples.append({"noise": noise_name, "snr_db": snr, "text": text, "noisy": heard_noisy,
                                "denoised": heard_clean, "errors_noisy": e_noisy, "errors_denoised": e_clean})
            rows.append([noise_name, snr, round(100 * before / total_words, 1), round(100 * after / total_words, 1),
                         round(100 * (after - before) / total_words, 1)])
            print(rows[-1], flush=True)

    rtf = sum(cpu_s) / audio_s
    clean_wer = round(100 * clean_errors / total_words, 1)
    clean_denoised_wer = round(100 * clean_denoised_errors / total_words, 1)
    report = Report(
        name=args.name, benchmark="noise_reduction",
        title="Noise reduction: Whisper word error rate before/after RNNoise",
        command=command_line(),
        config={"snr_db": args.snr, "utterances": len(texts), "words": total_words, "rate": RATE,
                "asr": "faster-whisper tiny.en int8, beam 1", "denoiser": f"RNNoise (pyrnnoise), soxr {args.quality} 24<->48 kHz",
                "whisper_threads": args.threads},
        summary={"clean_wer_pct": clean_wer, "clean_denoised_wer_pct": clean_denoised_wer, "denoiser_cpu_rtf": round(rtf, 4),
                 "wer_pct": {f"{r[0]}@{r[1]:g}dB": {"noisy": r[2], "denoised": r[3]} for r in rows}},
        samples={"transcripts": samples},
        columns=["noise", "SNR (dB)", "WER noisy (%)", "WER denoised (%)", "change (points)"],
        rows=rows,
        headline=f"clean speech WER {clean_wer}% ({clean_denoised_wer}% after RNNoise) over {total_words} words; "
                 f"RNNoise costs "
                 f"{1000 * rtf:.1f} ms CPU per second of 24 kHz audio",
        notes=[
            "SNR: speech power over noise power across the utterance (a quarter second of noise alone on each side).",
            "Speech and babble are the embedded Piper voice; babble is four other sentences reversed and overlapped.",
            "near_field and far_field run the same RNNoise model: the table holds for both.",
            ("Whisper tiny.en on synthetic speech: absolute numbers say little about real recordings; "
             "the before/after difference on the same mixes is the measurement. Piper samples its prosody, so "
             "another run speaks the sentences a little differently: with this few words a cell moves by several "
             "points between runs, the sign of the change much less."),
        ],
        reproduce=[command_line()],
    )
    report.duration_s = time.perf_counter() - began
    paths = write_report(report, args.out)
    print(paths["md"])


if __name__ == "__main__":
    main()
