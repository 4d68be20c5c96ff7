"""CPU of the avatar video track per call: frames drawn and VP8-encoded (aiortc's encoder) per
second, in silence and with a syllable-like voice, sending every frame or skipping still pictures.

    taskset -c 0 python benchmarks/avatar_cost.py
"""

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from aiortc.codecs.vpx import Vp8Encoder  # noqa: E402

from realtime_omni.transports.webrtc.avatar import AvatarTrack  # noqa: E402


async def run(level, seconds: float, still: float) -> tuple[float, float, float]:
    """(frames a second, VP8 encode's share of a core, the whole loop's share of a core)"""
    track = AvatarTrack(level, still_interval_s=still)
    enc = Vp8Encoder()
    frames, busy = 0, 0.0
    cpu0 = time.process_time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        frame = await track.recv()
        t0 = time.process_time()
        enc.encode(frame)
        busy += time.process_time() - t0
        frames += 1
    return frames / seconds, busy / seconds, (time.process_time() - cpu0) / seconds

async def main() -> None:
    rng = np.random.default_rng(0)
    speech = lambda: float(abs(np.sin(time.monotonic() * 9.0)) * rng.uniform(0.4, 1.0))  # syllable-like loudness
    silence = lambda: 0.0
    for name, level in (("silence", silence), ("speech", speech)):
        for still, label in ((0.0, "every frame (before)"), (1.0, "still pictures skipped")):
            fps, enc, total = await run(level, 6.0, still)
            print(f"{name:8s} {label:24s} {fps:5.1f} frames/s, VP8 encode {enc*100:.2f} %, all (draw, encode, pacing) {total*100:.2f} % of a core")
if __name__ == "__main__":
    asyncio.run(main())
