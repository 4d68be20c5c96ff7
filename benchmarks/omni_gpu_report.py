#!/usr/bin/env python
"""Write the report of an ``omni_gpu.py`` run (made on the GPU machine) under ``docs/benchmarks/``.

    python benchmarks/omni_gpu_report.py RESULTS.json --commit SHA --gpu "NVIDIA H200 (143771 MiB)" \\
        --driver 580.159.04 --cores 16 [--baseline OLD_REPORT.json] [--out docs/benchmarks]

The run happened elsewhere, so the machine and the commit are given on the command line rather
than read from this one. ``--baseline`` is an earlier report of the same benchmark (eager stages):
its numbers are quoted beside the new ones.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from realtime_omni_bench.report import Report, render_markdown, update_index  # noqa: E402


def steady_rtf(run: dict[str, Any]) -> list[float]:
    """Chunk RTF of every chunk after the first except the reply's last (which runs eagerly)."""
    out = []
    chunks = run["chunks"]
    for prev, chunk in zip(chunks, chunks[1:], strict=False):
        if chunk["final"] or not chunk["samples"]:
            continue
        out.append((chunk["ready_s"] - prev["ready_s"]) / (chunk["samples"] / 24_000))
    return out


def gapless_start(run: dict[str, Any]) -> float:
    """Earliest time (s) from which the audio plays without a gap: every chunk is ready by the
    time playback, started then, reaches it."""
    start, before = 0.0, 0.0
    for chunk in run["chunks"]:
        start = max(start, chunk["ready_s"] - before)
        before += chunk["samples"] / 24_000
    return start


def _fmt(values: list[float], digits: int = 0) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def build(results: dict[str, Any], baseline: dict[str, Any] | None, args) -> Report:
    old = (baseline or {}).get("summary", {})
    columns = ["measure"] + [m["name"] for m in results["models"]]
    rows: list[list[Any]] = []
    summary: dict[str, Any] = {}
    for m in results["models"]:
        runs = m["streaming"]
        steady = [steady_rtf(r) for r in runs]
        check = m.get("graph_check", {})
        prev = old.get(m["name"], {})
        summary[m["name"]] = {
            "ttfa_ms": [round(r["ttfa_ms"], 1) for r in runs],
            "first_token_ms": [round(r["first_token_ms"], 1) for r in runs],
            "gapless_start_ms": [round(1000 * gapless_start(r), 1) for r in runs],
            "first_codes_ms": [round(r["first_codes_ms"], 1) for r in runs],
            "thinker_ms_per_token": [round(v, 1) for v in m["summary"]["thinker_ms_per_token"]],
            "talker_ms_per_frame": [round(r["talker_ms_per_frame"], 1) for r in runs],
            "frame_ms": m["chunking"]["frame_ms"],
            "steady_chunk_rtf_max": [round(max(s), 2) for s in steady],
            "chunk_rtf_p50": [round(r["chunk_rtf_p50"], 2) for r in runs],
            "last_chunk_decode_ms": [round(1000 * r["chunks"][-1]["decode_s"]) for r in runs],
            "overall_rtf": [round(r["overall_rtf"], 2) for r in runs],
            "graphs": m["summary"]["graphs"],
            "graph_check": {k: check.get(k) for k in ("tokens_equal", "codes_equal", "audio_max_abs_diff_int16")},
            "eager_same_run": {"ttfa_ms": round(check.get("eager", {}).get("ttfa_ms", 0), 1),
                               "chunk_rtf_p50": round(check.get("eager", {}).get("chunk_rtf_p50", 0), 2)},
            "baseline_ttfa_ms": prev.get("ttfa_ms"),
            "baseline_chunk_rtf_p50": prev.get("chunk_rtf_p50"),
            "one_shot_time_to_audio_ms": prev.get("one_shot_time_to_audio_ms"),
            "gpu_mem_allocated_gb": round(m["gpu_mem_allocated_gb"], 1),
            "chunking": m["chunking"],
            "prompt_tokens": m["prompt_tokens"],
            "reply_tokens": m["reply_tokens"],
            "audio_s": m["summary"]["audio_s"],
        }
    names = [m["name"] for m in results["models"]]

    def row(label: str, fn) -> None:
        rows.append([label] + [fn(summary[n]) for n in names])

    row("**time to first audio, streaming (ms)**", lambda s: f"**{_fmt(s['ttfa_ms'])}**")
    row("earliest gap-free playback start (ms)", lambda s: _fmt(s["gapless_start_ms"]))
    row("same, eager stages: earlier run (this run's 16-token eager check), ms",
        lambda s: f"{_fmt(s['baseline_ttfa_ms'] or [])} ({s['eager_same_run']['ttfa_ms']:.0f})")
    row("time to audio, one-shot `generate` (earlier run, ms)", lambda s: s["one_shot_time_to_audio_ms"])
    row("first thinker token (prefill incl. audio encoder, ms)", lambda s: _fmt(s["first_token_ms"]))
    row("first talker chunk ready (ms)", lambda s: _fmt(s["first_codes_ms"]))
    row("thinker ms per token", lambda s: _fmt(s["thinker_ms_per_token"], 1))
    row("talker ms per frame (frame = ms of audio)", lambda s: f"{_fmt(s['talker_ms_per_frame'], 1)} ({s['frame_ms']:.0f})")
    row("**chunk RTF p50**", lambda s: f"**{_fmt(s['chunk_rtf_p50'], 2)}**")
    row("worst running chunk RTF (last chunk excluded)", lambda s: _fmt(s["steady_chunk_rtf_max"], 2))
    row("last chunk's codec time (eager, ms)", lambda s: _fmt(s["last_chunk_decode_ms"]))
    row("chunk RTF p50, eager stages: earlier run (this run's 16-token eager check)",
        lambda s: f"{_fmt(s['baseline_chunk_rtf_p50'] or [], 2)} ({s['eager_same_run']['chunk_rtf_p50']})")
    row("graphs vs eager, 16-token greedy reply", lambda s: "tokens {} · codes {} · audio Δ {} LSB".format(
        "equal" if s["graph_check"]["tokens_equal"] else "DIFFER",
        "equal" if s["graph_check"]["codes_equal"] else "DIFFER", s["graph_check"]["audio_max_abs_diff_int16"]))

    def plot(fig) -> None:
        axes = fig.subplots(1, len(results["models"]))
        for ax, m in zip(axes, results["models"], strict=True):
            for i, r in enumerate(m["streaming"]):
                t = [0.0] + [c["ready_s"] for c in r["chunks"]]
                produced = [0.0]
                for c in r["chunks"]:
                    produced.append(produced[-1] + c["samples"] / 24_000)
                ax.step(t, produced, where="post", label=f"audio ready, run {i + 1}")
            first = m["streaming"][0]["ttfa_ms"] / 1000
            end = m["streaming"][0]["chunks"][-1]["ready_s"]
            ax.plot([first, end], [0, end - first], "k--", lw=1, label="playback from first audio (run 1)")
            smooth = gapless_start(m["streaming"][0])
            ax.plot([smooth, end], [0, end - smooth], "k:", lw=1, label="gap-free playback start (run 1)")
            ax.set_title(m["name"], fontsize=9)
            ax.set_xlabel("seconds since the request")
            ax.set_ylabel("seconds of audio")
            ax.legend(fontsize=7)

    headline = ("H200, bf16 random weights, c=1, CUDA graphs: time to first audio "
                + ", ".join(f"{n} {_fmt(summary[n]['ttfa_ms'])} ms" for n in names)
                + "; chunk RTF p50 " + " / ".join(f"{summary[n]['chunk_rtf_p50'][-1]:.2f}" for n in names)
                + " (real time; eager stages were "
                + " / ".join(f"{(summary[n]['baseline_ttfa_ms'] or [0])[0]:.0f} ms, RTF "
                             f"{(summary[n]['baseline_chunk_rtf_p50'] or [0])[0]:.1f}" for n in names) + ")")
    return Report(
        name="omni-gpu", benchmark="omni-gpu",
        title="Omni engine on one H200: time to first audio and per-chunk RTF "
              "(Qwen2.5-Omni-7B, Qwen3-Omni-30B-A3B, random weights)",
        command=args.command, config={"args": results["args"], "dtype": "bfloat16 (Qwen2.5 token2wav float32, TF32 matmuls)",
                                      "weights": "random (meta → to_empty → _init_weights)"},
        summary=summary, samples={"models": results["models"]}, columns=columns, rows=rows,
        headline=headline, plot=plot, started_at=results["started"],
        notes=["Random weights: the thinker is forced to exactly 64 tokens and the talker to a fixed frame "
               "count (EOS suppressed).",
               "Streaming = three threads (think → talk → decode) connected by queues, as the pipeline runs "
               "the stages; each stage has its own CUDA stream.",
               "chunk RTF = wall time between consecutive audio chunks ÷ chunk duration."],
        reproduce=args.reproduce,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--driver", default=None)
    ap.add_argument("--cores", type=int, default=None)
    ap.add_argument("--ram-gib", type=int, default=None)
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--sections", type=Path, default=None, help="markdown appended to the page")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    args = ap.parse_args(argv)
    results = json.loads(args.results.read_text())
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    cfgs = " ".join(f"--config {c}" for c in results["args"]["config"])
    flags = " --check-graphs" if results["args"].get("check_graphs") else ""
    flags += " --no-one-shot" if not results["args"].get("one_shot", True) else ""
    args.command = f"python benchmarks/omni_gpu.py {cfgs} --out omni-gpu-raw.json{flags}"
    args.reproduce = [
        "# here: configs and the transformers wheel travel to the GPU machine",
        "mkdir -p .omni_cfg .whl && cp -r ../shared/model_configs/Qwen2.5-Omni-7B "
        "../shared/model_configs/Qwen3-Omni-30B-A3B-Instruct .omni_cfg/",
        "python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
        "--platform manylinux2014_x86_64 -d .whl transformers==5.24.0 'regex>=2025.10.22'",
        "# there (carry .whl and .omni_cfg):",
        "python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && "
        "export PYTHONPATH=/tmp/site:$PWD",
        args.command,
        "# here again:",
        "python benchmarks/omni_gpu_report.py omni-gpu-raw.json --commit SHA --gpu 'NVIDIA H200 (143771 MiB)' "
        "--driver 580.159.04 --cores 16 --ram-gib 128 --baseline OLD_REPORT.json --sections benchmarks/omni_gpu_sections.md",
    ]
    report = build(results, baseline, args)
    if args.sections is not None:
        text = args.sections.read_text()
        for part in text.split("\n## ")[1:]:
            title, _, body = part.partition("\n")
            report.sections.append((title.strip(), body.strip("\n")))
    data = report.to_json()
    data["git"] = {"commit": args.commit, "dirty": False}
    data["machine"] = {"cpu": f"{args.gpu} host", "usable_cores": args.cores, "cores": args.cores,
                       "ram_gib": args.ram_gib, "os": f"Linux, NVIDIA driver {args.driver}",
                       "gpu": args.gpu, "driver": args.driver, "python": results.get("python"),
                       "packages": results["models"][0].get("versions", {})}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 5), dpi=110, layout="constrained")
    report.plot(fig)
    fig.suptitle(f"{report.title}\n{data['date']} · commit {args.commit[:12]} · {args.gpu}", fontsize=8,
                 color="dimgray")
    fig.savefig(out / "omni-gpu.png")
    (out / "omni-gpu.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (out / "omni-gpu.md").write_text(render_markdown(report, data), encoding="utf-8")
    update_index(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
