"""Two or more ``omni_capacity.py`` runs of one model side by side (a build setting's A/B, e.g.
the lean code predictor against transformers' modules), as docs/benchmarks/<stem>.{json,md,png}.

    python3 benchmarks/omni_variant_report.py --title "..." --commit abc1234 --gpu "NVIDIA H200" \\
        --stem omni-qwen3-lean lean:q3.json modules:q3_modules.json

A variant may be one ``--sweep`` variant of a run: ``LABEL:PATH#NAME``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from omni_capacity_report import CHUNKS_NOTE, _f, chunk_table, first_audio_table, table


def compare_table(variants: list[tuple[str, dict]]) -> list[str]:
    """Per level, each variant's first audio, chunk RTF, throughput and talker step."""
    labels = [label for label, _ in variants]
    head = ("| sessions | " + " | ".join(f"{label}: TTFA p50 / p95 | {label}: chunk RTF p95 | {label}: audio s per "
                                         f"wall s | {label}: talker ms per step (device)" for label in labels) + " |")
    lines = [head, "|---|" + "---|" * (4 * len(labels))]
    levels = sorted({r["sessions"] for _, m in variants for r in m["runs"]})
    for n in levels:
        cells = []
        for _, m in variants:
            r = next((r for r in m["runs"] if r["sessions"] == n), None)
            if r is None:
                cells += ["—"] * 4
                continue
            talker = r["batches"].get("talker", {})
            cells += [f"{_f(r['ttfa_ms']['p50'])} / {_f(r['ttfa_ms']['p95'])}", _f(r["chunk_rtf"]["p95"], 2),
                      _f(r["audio_s_per_wall_s"], 1),
                      f"{_f(talker.get('ms_per_step'), 1)} ({_f(talker.get('device_ms_per_step'), 1)})"]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return lines


def host_table(variants: list[tuple[str, dict]]) -> list[str]:
    """Per level, the sessions' own threads' CPU time per session and frame (thinker + talker +
    codec: the capacity's host term as the level saw it), and what the engine's admission
    estimated at load (its host term measured on a throw-away reply)."""
    lines = ["| variant | sessions | host ms per session and frame (thinker / talker / codec) |", "|---|---|---|"]
    for label, m in variants:
        frames = m.get("frames") or 64
        for r in m["runs"]:
            cpu = r.get("session_cpu_s") or {}
            if not cpu:
                continue
            per = {k: 1000 * v / (r["sessions"] * frames) for k, v in cpu.items()}
            parts = " / ".join(_f(per.get(k), 3) for k in ("thinker", "talker", "codec"))
            lines.append(f"| {label} | {r['sessions']} | {_f(sum(per.values()), 3)} ({parts}) |")
    lines += ["", "| variant | admission at load: sessions | host ms per session and frame (load) |", "|---|---|---|"]
    for label, m in variants:
        est = m.get("capacity_estimate") or {}
        lines.append(f"| {label} | {est.get('sessions', '—')} | {_f(est.get('host_ms_per_frame'), 3)} |")
    return lines


def during_codec_passes(run: dict, stage: str) -> tuple[list[list], list[list]]:
    """The ``stage`` loop's steps (timeline rows) that began while a codec pass ran, and the rest."""
    timeline = run.get("timeline") or {}
    passes = [(start, start + ms) for start, ms, *_ in timeline.get("codec", [])]
    inside, outside = [], []
    for row in timeline.get(stage, []):
        (inside if any(a <= row[0] < b for a, b in passes) else outside).append(row)
    return inside, outside


def stall_table(variants: list[tuple[str, dict]]) -> list[str]:
    """Per level (its first 3 s, the runs' ``timeline``): how long the thinker's and talker's
    steps took when they began during a codec pass, against the others; and how long their
    launch took (the host queuing their work; recorded since 12c7a8c)."""
    lines = ["| variant | sessions | stage | steps during a pass: n, ms p50 / max | launch ms p50 / max "
             "| other steps: n, ms p50 |", "|---|---|---|---|---|---|"]
    for label, m in variants:
        for r in m["runs"]:
            for stage in ("thinker", "talker"):
                inside, outside = during_codec_passes(r, stage)
                if not inside:
                    continue
                ms = sorted(row[1] for row in inside)
                launch = sorted(row[3] for row in inside if len(row) > 3 and row[3] is not None)
                rest = sorted(row[1] for row in outside)
                lines.append(f"| {label} | {r['sessions']} | {stage} | {len(ms)}, {_f(ms[len(ms) // 2], 1)} / "
                             f"{_f(ms[-1], 1)} | " + (f"{_f(launch[len(launch) // 2], 1)} / {_f(launch[-1], 1)}"
                                                      if launch else "—")
                             + f" | {len(rest)}, " + (_f(rest[len(rest) // 2], 1) if rest else "—") + " |")
    return lines


def plot(variants: list[tuple[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for label, m in variants:
        n = [r["sessions"] for r in m["runs"]]
        ax1.plot(n, [r["batches"].get("talker", {}).get("ms_per_step") for r in m["runs"]], "o-", label=label)
        ax2.plot(n, [r["audio_s_per_wall_s"] for r in m["runs"]], "o-", label=label)
    ax1.set(xlabel="concurrent sessions", ylabel="ms", title="Talker step (wall)")
    ax2.set(xlabel="concurrent sessions", ylabel="audio s per wall s", title="Throughput")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", metavar="LABEL:PATH")
    ap.add_argument("--title", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--stem", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    args = ap.parse_args(argv)
    variants = []
    for spec in args.variants:
        label, _, path = spec.partition(":")
        path, _, sweep = path.partition("#")  # PATH#NAME: that --sweep variant's levels of the run
        model = json.loads(Path(path).read_text())["models"][0]
        if sweep:
            model = {**model, "runs": next(e["runs"] for e in model["sweep"] if e["name"] == sweep)}
        variants.append((label, model))
    md = [f"# {args.title}", "", f"Machine: {args.gpu}. Commit `{args.commit[:12]}`. Generated "
          f"{time.strftime('%Y-%m-%d')} by `benchmarks/omni_variant_report.py` from `benchmarks/omni_capacity.py` "
          "runs (N sessions opened, then N replies together; random bf16 weights at real size).", ""]
    if args.note:
        md += [args.note, ""]
    md += ["## Side by side", ""] + compare_table(variants) + [""]
    chunks = chunk_table(variants)
    if len(chunks) > 2:
        md += ["## Chunk by chunk", "", CHUNKS_NOTE, ""] + chunks + [""]
    stalls = stall_table(variants)
    if len(stalls) > 2:
        md += ["## Decode steps during codec passes", "", stall_table.__doc__.split("\n\n")[0].replace("\n    ", " "),
               ""] + stalls + [""]
    md += ["## The sessions' own threads", ""] + host_table(variants) + [""]
    for label, m in variants:
        md += [f"## {label}", ""] + table(m) + [""]
    md += first_audio_table([{**m, "name": f"{m['name']} ({label})"} for label, m in variants])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stem}.md").write_text("\n".join(md) + "\n")
    (args.out / f"{args.stem}.json").write_text(json.dumps({"title": args.title, "commit": args.commit,
                                                            "gpu": args.gpu, "variants": dict(variants)}, indent=1))
    plot(variants, args.out / f"{args.stem}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
