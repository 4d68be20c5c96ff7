"""Where Qwen2.5-Omni's codec (token2wav: DiT flow matching, then BigVGAN) spends a window.

Builds the token2wav model alone from a config (random float32 weights, as the engine runs it),
and times one codec window of the engine's steady shape for several batch sizes (windows of
that many sessions decoded together) and flow-matching step counts: the DiT's ODE and the vocoder
apart, eagerly and as one CUDA graph, with the DiT's transformer in each ``--dit-dtype``. Run on
the GPU machine:

    python benchmarks/omni_codec_profile.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \
        --out codec.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build(config_path: Path, device: str):
    import torch
    from transformers import Qwen2_5OmniConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    config = Qwen2_5OmniConfig(**json.loads(config_path.read_text()))
    with torch.device(device):
        model = Qwen2_5OmniToken2WavModel._from_config(config.token2wav_config, torch_dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # timing only: finite values everywhere (no NaN paths)
            p.normal_(0.0, 0.02)
    torch.backends.cuda.matmul.allow_tf32 = True  # as the engine's loader sets it
    return model.eval()


def timed(fn, repeats: int) -> float:
    """Median device milliseconds of ``fn()`` (wall time off CUDA)."""
    import torch

    times = []
    for _ in range(repeats):
        if not torch.cuda.is_available():
            t0 = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t0))
            continue
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def graph_ms(fn, repeats: int) -> float:
    """Median device milliseconds of ``fn`` captured as one CUDA graph (warmed up on a side stream)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return timed(graph.replay, repeats)


def modules_blocks(dit, hidden, time_embedding, window):
    """The DiT's blocks as transformers' ``DiTDecoderLayer``s run them (masks and rotary tables
    rebuilt in every evaluation): the baseline of ``--blocks modules``."""
    import torch

    positions = torch.arange(hidden.shape[1], device=hidden.device)[None].repeat(hidden.shape[0], 1)
    rope = dit.rotary_embed(hidden, positions)
    block_diff = dit._create_block_diff(hidden)
    for layer in dit.transformer_blocks:
        hidden = layer(hidden, time_embedding, position_embeddings=rope, block_diff=block_diff)
    return hidden


def kernel_table(fn, top: int = 14) -> dict:
    """One call of ``fn`` under the profiler: device ms by operator (self time), the busiest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(event, "self_cuda_time_total", 0)
        if device_us > 0:
            rows.append({"op": event.key[:80], "ms": round(device_us / 1000, 2), "calls": event.count})
    rows.sort(key=lambda r: -r["ms"])
    return {"device_ms": round(sum(r["ms"] for r in rows), 1), "ops": rows[:top]}


def profile(model, codes_len: int, batch: int, steps: int, repeats: int, dit_dtype: str = "float32",
            blocks: str = "lean", kernels: bool = False) -> dict:
    import torch

    from realtime_omni.engines.omni import waveform
    from realtime_omni.engines.omni.dit_blocks import run_blocks
    from realtime_omni.engines.omni.waveform import dit_sample, encode_speaker, set_dit_dtype, vocode

    unfused = functools.partial(run_blocks, fused=False)
    waveform.run_blocks = {"modules": modules_blocks, "unfused": unfused}.get(blocks, run_blocks)

    dev = next(model.parameters()).device
    dit, vocoder = model.code2wav_dit_model, model.code2wav_bigvgan_model
    set_dit_dtype(dit, dit_dtype)
    mel_dim = int(dit.mel_dim)
    frames = codes_len * dit.repeats
    gen = torch.Generator(device=dev).manual_seed(0)
    codes = torch.randint(0, int(model.config.dit_config.num_embeds), (batch, codes_len), device=dev, generator=gen)
    noise = torch.randn((batch, frames, mel_dim), device=dev, generator=gen)
    cond = torch.randn((1, int(model.config.dit_config.enc_emb_dim)), device=dev, generator=gen) * 0.1
    ref = torch.randn((1, 300, mel_dim), device=dev, generator=gen) * 0.1
    with torch.inference_mode():
        enc = encode_speaker(dit, ref, True)

        def ode():
            return dit_sample(dit, cond, ref, codes, noise, num_steps=steps, speaker_encoding=enc)

        mel = ode()
        if blocks == "lean":  # the fused norms against PyTorch's operations, same inputs
            waveform.run_blocks = unfused
            reference = ode()
            waveform.run_blocks = run_blocks
            fused_diff = float((mel - reference).abs().max() / reference.abs().max())

        def window():
            return vocode(vocoder, ode())

        out = {"codes": codes_len, "batch": batch, "dit_steps": steps, "dit_dtype": dit_dtype, "blocks": blocks,
               "mel_difference_from_unfused": fused_diff if blocks == "lean" else None,
               "dit_eager_ms": timed(ode, repeats), "vocoder_eager_ms": timed(lambda: vocode(vocoder, mel), repeats)}
        if dev.type != "cuda":
            return out
        if kernels:
            out["dit_kernels"] = kernel_table(ode)
            out["vocoder_kernels"] = kernel_table(lambda: vocode(vocoder, mel), top=8)
        out["window_graph_ms"] = graph_ms(window, repeats)
    out["window_graph_ms_per_window"] = out["window_graph_ms"] / batch
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--codes", type=int, nargs="+", default=[54],
                    help="window lengths in codes (54: the engine's steady window, 24 of context, 24 new, 2 held back)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    ap.add_argument("--steps", type=int, nargs="+", default=[10, 5, 4])
    ap.add_argument("--dit-dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                    help="the DiT transformer's precision (the engine's dit_dtype); each is timed")
    ap.add_argument("--blocks", nargs="+", default=["lean"], choices=["lean", "unfused", "modules"],
                    help="the DiT's blocks: the codec's own loop with its fused norm kernel (lean) or without "
                         "(unfused), or transformers' layers (modules)")
    ap.add_argument("--kernels", action="store_true", help="also profile each window's device time by operator")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch
    import transformers

    model = build(args.config, args.device)
    result = {"config": str(args.config), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__}, "runs": []}
    for codes_len in args.codes:
        for steps in args.steps:
            for dit_dtype in args.dit_dtype:
                for batch in args.batch:
                    for blocks in args.blocks:
                        row = profile(model, codes_len, batch, steps, args.repeats, dit_dtype, blocks, args.kernels)
                        print(json.dumps(row), flush=True)
                        result["runs"].append(row)
                        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
