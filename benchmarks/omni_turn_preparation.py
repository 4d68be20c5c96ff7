#!/usr/bin/env python
"""What a turn's own preparation costs on the host before its batched prefill is queued.

On the H200 the preparation of a turn took 3 ms alone and about 6.5 ms more for every session
preparing at the same time (210 ms p50 at N = 32): host work the sessions' threads do one after
another. Its size depends on the layer count more than on the layers' width, so the tiny CPU
checkpoint of the tests, given Qwen3-Omni-30B-A3B's 48 thinker and 20 talker layers, shows it on
the CPU: sessions open one by one and prefill the benchmark's spoken turn, with the thinker's
cache views built lazily in the turn (as before ``0fd9494``) and at session open (as the engine
does now on CUDA, ``StreamingThinker.prepare``).

    python benchmarks/omni_turn_preparation.py --out preparation.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--thinker-layers", type=int, default=48)
    ap.add_argument("--talker-layers", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    from omni_gpu import build_request
    from tests.engines.test_omni import qwen3_config

    from realtime_omni.engines.omni import OmniModel
    from realtime_omni.engines.settings import OmniSettings

    config = qwen3_config()
    config.thinker_config.text_config.num_hidden_layers = args.thinker_layers
    config.talker_config.text_config.num_hidden_layers = args.talker_layers
    folder = Path(tempfile.mkdtemp())
    config.to_json_file(folder / "config.json")
    settings = OmniSettings(device="cpu", dtype="float32", system_prompt="", max_new_tokens=8, seed=0,
                            max_sessions=8, cache_tokens=1024)
    model = OmniModel.random(folder / "config.json", settings, model_id="tiny")
    req, _msg, _n = build_request(model, 120, 2.0, 8)
    prefill = model.batching.prefill
    result: dict = {"thinker_layers": args.thinker_layers, "talker_layers": args.talker_layers, "modes": {}}
    for mode in ("views built in the turn", "views built at open"):
        opened, prepared = [], []
        for _ in range(args.turns):
            session = model.open_session()
            began = time.perf_counter()
            if mode.endswith("open"):
                session.thinker.prepare()
            opened.append(1000 * (time.perf_counter() - began))
            session.prefill(req)
            prepared.append(1000 * prefill.recent[-1][0])
            session.close()
        row = {"open_extra_ms": statistics.median(opened), "prepared_ms": statistics.median(prepared)}
        result["modes"][mode] = row
        print(f"{mode}: preparation {row['prepared_ms']:.2f} ms p50, at open {row['open_extra_ms']:.2f} ms",
              flush=True)
    model.close()
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
