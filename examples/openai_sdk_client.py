"""Talk to a realtime-omni server with the official ``openai`` SDK, from a WAV file.

Streams the WAV (any sample rate, mono or stereo, 8/16/32-bit PCM; resampled to 24 kHz with soxr)
to ``/v1/realtime`` at real-time pace like a microphone, then keeps sending silence so the
server's voice activity detector ends the turn. Prints the transcript of what you said and the
assistant's reply as it streams, and writes the reply audio to a WAV file (``--out``; by default
``reply.wav`` in a new temporary folder, never the current one).

    realtime-omni serve &                                   # the embedded model, port 8000
    python examples/openai_sdk_client.py media/question.wav
    python examples/openai_sdk_client.py my_question.wav --url http://127.0.0.1:8000 --out reply.wav
    python examples/openai_sdk_client.py media/question.wav --fast     # send as fast as possible

Against OpenAI itself, the same code runs with ``--url https://api.openai.com`` and a real key in
``OPENAI_API_KEY``; a realtime-omni server accepts any key.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np
import soxr
from openai import AsyncOpenAI

RATE = 24_000  # audio/pcm in the Realtime API: 24 kHz pcm16 mono
CHUNK_MS = 20


def read_wav(path: Path) -> np.ndarray:
    """int16 mono at 24 kHz."""
    with wave.open(str(path), "rb") as wav:
        rate, channels, width = wav.getframerate(), wav.getnchannels(), wav.getsampwidth()
        raw = wav.readframes(wav.getnframes())
    if width == 1:
        pcm = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128) / 128
    elif width == 2:
        pcm = np.frombuffer(raw, "<i2").astype(np.float32) / 32768
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3)
        pcm = ((b[:, 0].astype(np.int32) | b[:, 1].astype(np.int32) << 8 | b[:, 2].astype(np.int32) << 16) << 8 >> 8) / 8388608
    elif width == 4:
        pcm = np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648
    else:
        raise SystemExit(f"{path}: unsupported sample width {width}")
    pcm = np.asarray(pcm, dtype=np.float32).reshape(-1, channels).mean(axis=1)
    if rate != RATE:
        pcm = soxr.resample(pcm, rate, RATE, quality="HQ")
    return np.clip(np.round(pcm * 32767), -32768, 32767).astype(np.int16)


def write_wav(path: Path, pcm16: bytes) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(pcm16)


async def talk(args: argparse.Namespace) -> int:
    speech = read_wav(args.wav)
    url = args.url.rstrip("/")
    ws_url = "ws" + url[4:] if url.startswith("http") else url
    client = AsyncOpenAI(
        api_key=os.environ.get("OPENAI_API_KEY", "not-needed"),
        base_url=f"{url}/v1",
        websocket_base_url=f"{ws_url}/v1",
    )
    reply = bytearray()
    done = asyncio.Event()
    t0 = time.perf_counter()

    def stamp() -> str:
        return f"[{time.perf_counter() - t0:6.2f}s]"

    async with client.realtime.connect(model=args.model) as conn:
        await conn.session.update(session={
            "type": "realtime",
            "output_modalities": ["audio"],
            **({"instructions": args.instructions} if args.instructions else {}),
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": RATE},
                    "transcription": {"model": "whisper-1"},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": args.silence_ms},
                },
                "output": {"format": {"type": "audio/pcm", "rate": RATE}, "voice": args.voice},
            },
        })

        async def receive() -> None:
            speaking = False
            async for event in conn:
                kind = event.type
                if kind == "session.created":
                    print(f"{stamp()} connected: session {event.session.id}, model {event.session.model}")
                elif kind == "input_audio_buffer.speech_started":
                    print(f"{stamp()} (speech started)")
                elif kind == "input_audio_buffer.speech_stopped":
                    print(f"{stamp()} (speech stopped)")
                elif kind == "conversation.item.input_audio_transcription.completed":
                    print(f"{stamp()} you: {event.transcript.strip()}")
                elif kind == "response.output_audio_transcript.delta":
                    if not speaking:
                        print(f"{stamp()} assistant: ", end="")
                        speaking = True
                    print(event.delta, end="", flush=True)
                elif kind == "response.output_text.delta":
                    print(event.delta, end="", flush=True)
                elif kind == "response.output_audio.delta":
                    reply.extend(base64.b64decode(event.delta))
                elif kind == "response.done":
                    if speaking:
                        print()
                    speaking = False
                    usage = event.response.usage
                    tokens = f", {usage.output_tokens} output tokens" if usage else ""
                    print(f"{stamp()} response {event.response.status}{tokens}, {len(reply) / 2 / RATE:.2f} s of audio")
                    done.set()
                elif kind == "error":
                    print(f"{stamp()} error {event.error.code}: {event.error.message}", file=sys.stderr)

        receiver = asyncio.create_task(receive())
        chunk = RATE * CHUNK_MS // 1000
        silence = np.zeros(chunk, dtype=np.int16)
        padded = np.concatenate([speech, np.zeros((-speech.size) % chunk, dtype=np.int16)])
        frames = [padded[i : i + chunk] for i in range(0, padded.size, chunk)]
        deadline = None
        due = time.perf_counter()
        try:
            # the file, then silence (a quiet microphone) until the reply is complete
            while not done.is_set():
                from_file = bool(frames)
                frame = frames.pop(0) if from_file else silence
                await conn.input_audio_buffer.append(audio=base64.b64encode(frame.tobytes()).decode())
                if not from_file:
                    if deadline is None:
                        deadline = time.perf_counter() + args.timeout
                    elif time.perf_counter() > deadline:
                        print(f"{stamp()} no reply within {args.timeout:g} s", file=sys.stderr)
                        break
                if from_file and args.fast:
                    due = time.perf_counter()
                    continue
                due += CHUNK_MS / 1000
                await asyncio.sleep(max(due - time.perf_counter(), 0))
        finally:
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    if reply:
        out = args.out or Path(tempfile.mkdtemp(prefix="realtime-omni-reply-")) / "reply.wav"
        write_wav(out, bytes(reply))
        print(f"wrote {out} ({len(reply) / 2 / RATE:.2f} s)")
    return 0 if done.is_set() else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wav", type=Path, help="what to say: a WAV file")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server (default: %(default)s)")
    parser.add_argument("--model", default="embedded", help="model (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="where to write the reply audio (default: reply.wav in a new "
                                                  "temporary folder)")
    parser.add_argument("--voice", default="alloy")
    parser.add_argument("--instructions", help="system instructions for the session")
    parser.add_argument("--silence-ms", type=int, default=500, help="server VAD silence before the turn ends (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the reply after the file (default: %(default)s)")
    parser.add_argument("--fast", action="store_true", help="send the file as fast as possible (then silence at real-time pace)")
    return asyncio.run(talk(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
