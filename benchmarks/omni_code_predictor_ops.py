"""Operations per frame of Qwen3-Omni's code predictor: transformers' modules against the lean
layout (``realtime_omni/engines/omni/code_predictor_lean.py``), counted on the CPU.

A replayed CUDA graph still runs every kernel of a frame one after another, and at decode sizes
each costs about its launch and latency: the count of a frame's operations is what this measures,
with the real code predictor's shapes (5 layers, 16 heads of 128, 16 codebooks) and random bf16
weights. The operations are counted with the torch profiler as the leaf ATen operations that do
work (views and allocation left out); ``rms_norm`` counts once, as the fused kernel it is on CUDA
(on the CPU it runs as seven). The count on CUDA differs in detail (a CPU ``roll`` is a
``cat``); the GPU's time per talker step is measured by ``omni_capacity.py``
(``--modules-code-predictor`` for the modules).

    python3 benchmarks/omni_code_predictor_ops.py \\
        --config ../shared/model_configs/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import subprocess
import time
import types
from pathlib import Path

#: operations that do no work of their own (views, allocation, dispatch wrappers)
NO_WORK = {
    "aten::as_strided", "aten::view", "aten::_unsafe_view", "aten::empty", "aten::empty_strided",
    "aten::resolve_conj", "aten::result_type", "aten::_reshape_alias", "aten::resize_", "aten::scalar_tensor",
    "aten::expand", "aten::reshape", "aten::transpose", "aten::t", "aten::slice", "aten::select",
    "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::detach", "aten::alias", "aten::contiguous",
    "aten::unbind", "aten::split", "aten::split_with_sizes", "aten::narrow", "aten::lift_fresh", "aten::_to_copy",
    "aten::to", "aten::matmul", "aten::linear", "aten::clone", "aten::index_put", "aten::repeat",
    "aten::scaled_dot_product_attention", "aten::embedding", "aten::softmax", "aten::masked_fill",
    "aten::index", "aten::roll", "aten::view_as",
}


def build(config_path: Path, dtype):
    """The code predictor of ``config_path`` with random weights, and what ``frame_step`` reads of
    a loaded model (the transformers fusions the server applies on CUDA applied here too)."""
    import torch
    from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as configs
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as modeling

    from realtime_omni.engines.omni.fused import fuse_rms_norms, use_short_attention

    raw = json.loads(config_path.read_text())
    talker_config = configs.Qwen3OmniMoeTalkerConfig(**raw["talker_config"])
    torch.manual_seed(0)
    cp = modeling.Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration._from_config(
        talker_config.code_predictor_config, torch_dtype=dtype).eval()
    with torch.no_grad():
        for name, param in cp.named_parameters():
            param.copy_(1.0 + 0.1 * torch.randn_like(param) if "norm" in name else 0.05 * torch.randn_like(param))
    fuse_rms_norms(cp)
    use_short_attention(cp.model.config)
    width = talker_config.text_config.hidden_size
    talker = types.SimpleNamespace(code_predictor=cp, codec_head=torch.nn.Linear(width, 8).to(dtype),
                                   model=types.SimpleNamespace(codec_embedding=torch.nn.Embedding(
                                       talker_config.text_config.vocab_size, width).to(dtype)))
    return types.SimpleNamespace(talker=talker, config=types.SimpleNamespace(talker_config=talker_config),
                                 cache_kwarg="past_key_values", device=torch.device("cpu"))


def count(step) -> collections.Counter:
    """Working operations of one call of ``step``, by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ops: collections.Counter = collections.Counter()
    for event in prof.events():
        if event.name == "aten::rms_norm":
            ops["rms_norm"] += 1
            continue
        if not event.name.startswith("aten::") or event.name in NO_WORK or _inside_norm(event):
            continue
        if all(c.name in NO_WORK or not c.name.startswith("aten::") for c in event.cpu_children):
            ops[event.name.removeprefix("aten::")] += 1
    return ops


def _inside_norm(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == "aten::rms_norm":
            return True
        parent = parent.cpu_parent
    return False


def measure(loaded, buckets: list[int]) -> list[dict]:
    import torch

    from realtime_omni.engines.omni.code_predictor import CodePredictorSpec, frame_step

    spec = CodePredictorSpec.of(loaded)
    width = loaded.config.talker_config.text_config.hidden_size
    rows = []
    for bucket in buckets:
        gen = torch.Generator().manual_seed(bucket)
        inputs = (torch.randn((bucket, width), generator=gen).to(loaded.talker.codec_head.weight.dtype),
                  torch.randint(0, spec.top_k, (bucket, 1), generator=gen),
                  torch.rand((bucket, spec.groups - 1, spec.top_k), generator=gen))
        row: dict = {"rows": bucket}
        codes = {}
        for name, lean in (("modules", False), ("lean", True)):
            step = frame_step(loaded, False, lean=lean)(bucket, None, inputs)
            with torch.inference_mode():
                codes[name] = step()[0]
                ops = count(step)
                started = time.perf_counter()
                step()
                row[f"{name}_cpu_ms"] = 1000 * (time.perf_counter() - started)
            row[f"{name}_ops"] = sum(ops.values())
            row[f"{name}_by_op"] = dict(ops.most_common())
        # bf16 rounding differs between the two (as it does between the modules with and
        # without the fused norms): the share of equal greedy codes, and of equal first codes
        row["codes_equal"] = float((codes["modules"] == codes["lean"]).float().mean())
        row["first_codes_equal"] = float((codes["modules"][:, 0] == codes["lean"][:, 0]).float().mean())
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_by_op")}), flush=True)
    return rows


def report(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "omni-code-predictor-ops.json").write_text(json.dumps(result, indent=1))
    lines = ["# Qwen3-Omni code predictor: operations per frame", "",
             f"Commit `{result['commit']}`, {result['machine']}, torch {result['torch']}, "
             f"transformers {result['transformers']}; {result['dtype']}, random weights, the shapes of "
             f"`{result['config']}`. Made by `benchmarks/omni_code_predictor_ops.py` (its docstring says "
             "what is counted). A frame: the 15 residual codebooks of one 80 ms codec frame, for every "
             "row (session) of the batch.", "",
             "| rows | modules: ops per frame | lean: ops per frame | fewer | greedy codes equal (first code) | "
             "CPU ms per frame: modules / lean |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['rows']} | {r['modules_ops']} | {r['lean_ops']} | "
                     f"{1 - r['lean_ops'] / r['modules_ops']:.0%} | {r['codes_equal']:.0%} ({r['first_codes_equal']:.0%}) | "
                     f"{r['modules_cpu_ms']:.0f} / {r['lean_cpu_ms']:.0f} |")
    first = result["rows"][0]
    lines += ["", "Operations of one frame by name (first row count):", "",
              "| operation | modules | lean |", "|---|---|---|"]
    names = sorted(set(first["modules_by_op"]) | set(first["lean_by_op"]),
                   key=lambda n: -(first["modules_by_op"].get(n, 0) + first["lean_by_op"].get(n, 0)))
    for name in names:
        lines.append(f"| {name} | {first['modules_by_op'].get(name, 0)} | {first['lean_by_op'].get(name, 0)} |")
    lines += ["", "In bfloat16 the two round differently, so greedy codes of random weights part ways after "
              "a near tie (the modules with and without the fused norms part ways as often); in float32 "
              "they are equal, which `tests/engines/test_omni.py` checks on the tiny checkpoint.", ""]
    (out / "omni-code-predictor-ops.md").write_text("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(result["rows"]))
    ax.bar([x - 0.2 for x in xs], [r["modules_ops"] for r in result["rows"]], 0.4, label="transformers modules")
    ax.bar([x + 0.2 for x in xs], [r["lean_ops"] for r in result["rows"]], 0.4, label="lean layout")
    ax.set_xticks(list(xs), [str(r["rows"]) for r in result["rows"]])
    ax.set_xlabel("rows (sessions) per frame")
    ax.set_ylabel("operations per frame")
    ax.set_title("Qwen3-Omni code predictor frame")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "omni-code-predictor-ops.png", dpi=120)


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 8, 32])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = ap.parse_args(argv)
    loaded = build(args.config, getattr(torch, args.dtype))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"commit": commit or "unknown", "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
              "torch": torch.__version__, "transformers": transformers.__version__, "dtype": args.dtype,
              "config": f"{args.config.parent.name}/{args.config.name}", "rows": measure(loaded, args.rows)}
    report(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
