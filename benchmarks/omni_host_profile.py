#!/usr/bin/env python
"""Where the sessions' own threads spend the interpreter: a CPU profile (yappi, CPU clock) of
one capacity level, the sessions' threads only (not the stages' loops).

N sessions answer together as in ``omni_capacity.py`` (its ``run_n``: replies forced to
``--reply-tokens`` tokens, random weights); one level runs first unprofiled (the warm-up), the
next under the profiler. The functions are ranked by their own CPU time per session and frame,
in microseconds, and grouped by file, so the 1.2 ms per session and frame measured on the H200
(``session_cpu_s`` in the capacity runs) can be taken apart: host work, driver calls, waits that
spin (a device synchronisation counts the time it spins on the host).

    python benchmarks/omni_host_profile.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \\
        --sessions 32 --out host-profile.json

yappi is not a project dependency: ``pip install yappi`` here, or carry its wheel to the GPU
machine (``scripts/gpu-next.sh host-profile``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from omni_capacity import run_n  # noqa: E402
from omni_gpu import _sync, build_request  # noqa: E402

#: thread names of the stages' own loops and the load (everything else is a session's)
LOOP_THREADS = ("batch-", "omni-", "MainThread", "prefill")


def profile_level(model, req, n: int, frames: int, top: int) -> dict:
    import yappi

    yappi.set_clock_type("cpu")
    yappi.set_context_name_callback(lambda: threading.current_thread().name)
    yappi.start()
    began = time.perf_counter()
    level = run_n(model, req, n)
    wall = time.perf_counter() - began
    yappi.stop()
    threads = yappi.get_thread_stats()
    sessions = {t.id for t in threads if not t.name.startswith(LOOP_THREADS)}
    per = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for tid in sessions:
        for f in yappi.get_func_stats(filter={"ctx_id": tid}):
            key = f"{Path(f.module).name}:{f.lineno} {f.name}"
            per[key][0] += f.tsub
            per[key][1] += f.ttot
            per[key][2] += f.ncall
    by_file: dict[str, float] = collections.defaultdict(float)
    for key, (tsub, _, _) in per.items():
        by_file[key.split(":", 1)[0]] += tsub
    yappi.clear_stats()
    made = n * frames
    us = 1e6 / made

    def ranked(items, k):
        return [{"name": name, "self_us": round(v[0] * us, 2), "total_us": round(v[1] * us, 2),
                 "calls_per_frame": round(v[2] / made, 2)}
                for name, v in sorted(items, key=lambda kv: -kv[1][0])[:k]]

    return {
        "sessions": n, "frames_per_session": frames, "wall_s": wall,
        "profiled_cpu_s": sum(t.ttot for t in threads if t.id in sessions),
        # the level's own counters (outside the profiler's overhead: per session thread, CPU time)
        "session_cpu_ms_per_frame": {k: 1000 * v / made for k, v in level["session_cpu_s"].items()},
        "audio_s_per_wall_s": level["audio_s_per_wall_s"],
        "functions": ranked(per.items(), top),
        "files_us_per_frame": {k: round(v * us, 2) for k, v in sorted(by_file.items(), key=lambda kv: -kv[1])[:30]},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--top", type=int, default=60)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    from realtime_omni.engines.omni import OmniModel
    from realtime_omni.engines.omni.loader import detect_architecture
    from realtime_omni.engines.settings import OmniSettings

    arch = detect_architecture(json.loads(args.config.read_text()), where=str(args.config))
    frames = 3 * args.reply_tokens if arch == "qwen2_5_omni" else args.reply_tokens
    settings = OmniSettings(device=args.device, dtype=args.dtype, ignore_eos=True, system_prompt="",
                            max_new_tokens=args.reply_tokens, talker_max_frames=frames + 1, seed=0,
                            max_sessions=max(4, args.sessions), realtime_admission="off")
    model = OmniModel.random(args.config, settings, model_id=args.config.parent.name, progress=print)
    _sync()
    req, _msg, _tokens = build_request(model, 120, 2.0, args.reply_tokens)
    try:
        run_n(model, req, args.sessions)  # the level's shapes met once, unprofiled
        result = profile_level(model, req, args.sessions, frames, args.top)
    finally:
        model.close()
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("sessions", "session_cpu_ms_per_frame", "audio_s_per_wall_s")}))
    for row in result["functions"][:25]:
        print(f"{row['self_us']:8.1f} {row['total_us']:8.1f} {row['calls_per_frame']:6.2f}  {row['name']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
