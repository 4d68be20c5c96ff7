"""Qwen2.5-Omni's BigVGAN vocoder with its anti-aliased activations as fused kernels
(``engines/omni/vocoder_kernels.py``) against transformers' modules: one batch of windows, eager
and as a CUDA graph, the largest difference between the two waveforms, and the fused window's
device time by operator. Random float32 weights at the real size. Run on the GPU machine:

    python benchmarks/omni_vocoder_kernels.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \\
        --out vocoder.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.omni_codec_profile import graph_ms, kernel_table, timed  # noqa: E402


def build(config_path: Path, device: str):
    import torch
    from transformers import Qwen2_5OmniConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavBigVGANModel

    config = Qwen2_5OmniConfig(**json.loads(config_path.read_text()))
    with torch.device(device):
        model = Qwen2_5OmniToken2WavBigVGANModel._from_config(config.token2wav_config.bigvgan_config,
                                                              torch_dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # timing only: finite values everywhere, SnakeBeta not flat
            p.normal_(0.0, 0.02)
    torch.backends.cuda.matmul.allow_tf32 = True  # as the engine's loader sets it
    return model.eval()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--frames", type=int, default=156, help="mel frames per window (156: a 78-code window)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    from realtime_omni.engines.omni.waveform import vocode

    model = build(args.config, "cuda")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "frames": args.frames, "runs": []}
    for batch in args.batch:
        gen = torch.Generator(device="cuda").manual_seed(batch)
        mel = torch.randn((batch, int(model.config.mel_dim), args.frames), device="cuda", generator=gen) - 4
        with torch.inference_mode():
            modules = vocode(model, mel, fused=False)
            fused = vocode(model, mel, fused=True)
            row = {"batch": batch, "max_abs_diff": float((fused - modules).abs().max()),
                   "max_abs": float(modules.abs().max())}
            for name, flag in (("modules", False), ("fused", True)):
                row[f"{name}_eager_ms"] = timed(lambda: vocode(model, mel, fused=flag), args.repeats)
                row[f"{name}_graph_ms"] = graph_ms(lambda: vocode(model, mel, fused=flag), args.repeats)
            row["fused_kernels"] = kernel_table(lambda: vocode(model, mel, fused=True), top=10)
        print(json.dumps(row), flush=True)
        result["runs"].append(row)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
