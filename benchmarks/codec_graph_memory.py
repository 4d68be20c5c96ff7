"""What the codec's window graphs hold on the GPU, by how they are captured, and whether they
still render what the window's eager run renders.

The thinker's and talker's decoder layers are cut to one (the codec is left at its real size), so
that each variant loads in seconds; every variant then warms up as a server's load does, with
``--slots`` sessions' group buckets. Per variant: the GPU memory the model holds after its load,
the window graphs captured, and (Qwen3, whose windows take only codes) for a sample of them
replayed in a shuffled order from two streams, the largest difference from the same window run
eagerly.

    python3 benchmarks/codec_graph_memory.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \\
        --slots 32 --out /tmp/memory.json

Variants are ``NAME:QUEUED_PIECES:SHARED_POOL`` (``pieces_shared:4:1`` is the default build).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_VARIANTS = ["whole:0:0", "pieces:4:0", "pieces_shared:4:1", "whole_shared:0:1"]


def thin_config(path: Path, out: Path) -> Path:
    """The config with the thinker's and talker's decoders cut to one layer."""
    config = json.loads(path.read_text())
    for stage in ("thinker_config", "talker_config"):
        text = config.get(stage, {}).get("text_config", config.get(stage, {}))
        if "num_hidden_layers" in text:
            text["num_hidden_layers"] = 1
    if "accept_hidden_layer" in config.get("talker_config", {}):  # Qwen3's talker reads this layer
        config["talker_config"]["accept_hidden_layer"] = 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    return out / "config.json"


def check_replays(windows, sample: int, seed: int) -> dict:
    """Replay up to ``sample`` captured windows in a shuffled order, every other one from a
    second stream, each against its eager run on the same inputs."""
    import torch

    entries = [(key, entry) for key, entry in windows._graphs.items() if entry[1].captured]
    rng = random.Random(seed)
    rng.shuffle(entries)
    entries = entries[:sample]
    side = torch.cuda.Stream()
    worst = 0.0
    with torch.inference_mode():
        wants, gots = [], []
        for i, (key, (static, graph)) in enumerate(entries):
            inputs = tuple(_like(t, rng) for t in static)
            for dst, src in zip(static, inputs, strict=True):
                dst.copy_(src)
            wants.append(_first(graph.step()).float().clone())
            stream = side if i % 2 else torch.cuda.current_stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                gots.append(_first(windows.run(key, lambda *_: None, inputs)).float())
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for want, got in zip(wants, gots, strict=True):
            scale = float(want.abs().max()) or 1.0
            worst = max(worst, float((want - got).abs().max()) / scale)
    return {"replayed": len(entries), "worst_relative_difference": worst}


def _like(t, rng: random.Random):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(rng.randrange(1 << 30))
    if t.is_floating_point():
        return torch.randn(t.shape, generator=gen).to(t.device, t.dtype)
    high = int(t.max()) + 1 if t.numel() else 1
    return torch.randint(0, max(1, high), t.shape, generator=gen).to(t.device, t.dtype)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def run_variant(config: Path, slots: int, name: str, queued: int, shared: bool, sample: int) -> dict:
    import torch

    from realtime_omni.engines.omni import OmniModel
    from realtime_omni.engines.settings import OmniSettings

    before = torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    settings = OmniSettings(device="cuda", dtype="bfloat16", ignore_eos=True, system_prompt="", seed=0,
                            max_sessions=slots, max_new_tokens=64, talker_max_frames=256, cache_tokens=1024,
                            codec_queued_pieces=queued, codec_shared_pool=shared, realtime_admission="off")
    model = OmniModel.random(config, settings, model_id=config.parent.name)
    torch.cuda.synchronize()
    row = {"variant": name, "queued_pieces": queued, "shared_pool": shared, "load_s": time.perf_counter() - t0,
           "reserved_gb": (torch.cuda.memory_reserved() - before) / 1e9,
           "allocated_gb": torch.cuda.memory_allocated() / 1e9,
           "window_graphs": model.codec.windows.captured if model.codec is not None else 0}
    # random codes are valid inputs of Qwen3's windows; Qwen2.5's also take lengths and masks
    if model.codec is not None and model.arch == "qwen3_omni_moe":
        row.update(check_replays(model.codec.windows, sample, seed=1))
    print(json.dumps(row), flush=True)
    model.close()
    return row


def in_own_process(thin: Path, args: argparse.Namespace, spec: str) -> dict:
    """One variant in a process of its own (each starts from an empty GPU; one that runs out of
    memory leaves the others' numbers)."""
    cmd = [sys.executable, __file__, "--config", str(thin), "--slots", str(args.slots), "--sample", str(args.sample),
           "--variants", spec, "--out", "-", "--one"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and rows:
        return json.loads(rows[-1])
    name, queued, shared = spec.split(":")
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"variant": name, "queued_pieces": int(queued), "shared_pool": shared == "1", "error": last[:400]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, nargs="+", required=True)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    ap.add_argument("--sample", type=int, default=12, help="captured windows replayed against eager runs")
    ap.add_argument("--timeout", type=float, default=240, help="seconds each variant may take")
    ap.add_argument("--out", required=True)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a variant's own process
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("codec_graph_memory: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.one:
        name, queued, shared = args.variants[0].split(":")
        run_variant(args.config[0], args.slots, name, int(queued), shared == "1", args.sample)
        return 0
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "slots": args.slots, "models": []}
    for path in args.config:
        thin = thin_config(path, Path("/tmp/codec_graph_memory") / path.parent.name)
        model = {"config": str(path), "variants": []}
        result["models"].append(model)
        for spec in args.variants:
            model["variants"].append(in_own_process(thin, args, spec))
            print(json.dumps(model["variants"][-1]), flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
