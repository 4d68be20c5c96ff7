"""Qwen2.5-Omni's BigVGAN vocoder: where a window's time goes and what its anti-aliased
activations cost in equivalent formulations.

Each of the vocoder's 109 anti-aliased activations upsamples by 2 with a depthwise transposed
convolution (one fixed filter for every channel), applies SnakeBeta, and downsamples with a
depthwise convolution. This times, for one batch of windows (random float32 weights):

- ``grouped``: transformers' modules (grouped convolutions over the channels);
- ``flat``: the same filters with the channels folded into the batch (one channel, no groups);
- ``polyphase``: the upsampling as two 6-tap convolutions (its even and odd outputs), interleaved;

each with cuDNN's heuristics and with ``torch.backends.cudnn.benchmark``, the whole vocoder window
eager and as a CUDA graph, and checks that each variant gives the grouped waveform. Run on the GPU
machine: ``python benchmarks/omni_vocoder_variants.py --config <Qwen2.5 config> --out v.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.omni_codec_profile import kernel_table, timed  # noqa: E402


def build(config_path: Path, device: str):
    import torch
    from transformers import Qwen2_5OmniConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavBigVGANModel

    config = Qwen2_5OmniConfig(**json.loads(config_path.read_text()))
    with torch.device(device):
        model = Qwen2_5OmniToken2WavBigVGANModel._from_config(config.token2wav_config.bigvgan_config,
                                                              torch_dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    torch.backends.cuda.matmul.allow_tf32 = True
    return model.eval()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--frames", type=int, default=156, help="mel frames per window (156: a 78-code window)")
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--variants", nargs="+", default=["grouped", "flat", "polyphase"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    from realtime_omni.engines.omni.waveform import vocode

    model = build(args.config, args.device)
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "runs": []}
    for batch in args.batch:
        gen = torch.Generator(device=args.device).manual_seed(batch)
        mel = torch.randn((batch, int(model.config.mel_dim), args.frames), device=args.device, generator=gen) - 4
        reference = None
        for benchmark in (False, True):
            torch.backends.cudnn.benchmark = benchmark
            for variant in args.variants:
                with torch.inference_mode():
                    wav = vocode(model, mel, variant)
                    reference = wav if reference is None else reference
                    row = {"batch": batch, "variant": variant, "cudnn_benchmark": benchmark,
                           "max_abs_diff": float((wav - reference).abs().max()),
                           "eager_ms": timed(lambda: vocode(model, mel, variant), args.repeats)}
                    if args.device == "cuda":
                        side = torch.cuda.Stream()
                        side.wait_stream(torch.cuda.current_stream())
                        with torch.cuda.stream(side):
                            for _ in range(2):
                                vocode(model, mel, variant)
                        torch.cuda.current_stream().wait_stream(side)
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            vocode(model, mel, variant)
                        row["graph_ms"] = timed(graph.replay, args.repeats)
                        del graph
                        if not benchmark:
                            row["kernels"] = kernel_table(lambda: vocode(model, mel, variant), top=8)
                print(json.dumps(row), flush=True)
                result["runs"].append(row)
                args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
