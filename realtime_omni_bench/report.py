"""Benchmark reports: ``<name>.json`` (raw samples, summary, machine, commit), ``<name>.md``
(readable table + how to reproduce) and ``<name>.png`` (matplotlib, Agg) under one folder, plus
that folder's ``README.md`` index, regenerated from every report JSON present.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

SCHEMA = "realtime-omni-bench/1"

#: distributions reported in ``machine.packages`` when installed
PACKAGES = (
    "realtime-omni", "openai", "websockets", "uvicorn", "uvloop", "starlette", "pydantic", "numpy", "soxr",
    "onnxruntime", "faster-whisper", "ctranslate2", "gguf", "onnx", "llguidance", "piper-tts", "silero-vad", "torch",
    "transformers", "vllm", "aiortc", "matplotlib",
)

INDEX_HEADER = """# Benchmarks

Reports written by `realtime-omni bench <name>`. Each report has a JSON file (raw samples,
p50/p95/p99 summary, machine, git commit, date and the exact command), a markdown page and a plot.
This index is regenerated from the JSON files present whenever a benchmark writes a report
(or by `python -m realtime_omni_bench.report docs/benchmarks`).

"""


# ------------------------------------------------------------------------------ statistics
def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), ``None`` for no values."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (rank - lo))


def summarize(values: Iterable[float | None], ps: Sequence[float] = (50, 95, 99), digits: int = 1) -> dict[str, Any]:
    """``{"n", "p50", "p95", "p99", "mean", "min", "max"}`` (values in the caller's unit)."""
    data = [float(v) for v in values if v is not None and not math.isnan(v)]
    out: dict[str, Any] = {"n": len(data)}
    for p in ps:
        value = percentile(data, p)
        out[f"p{p:g}"] = None if value is None else round(value, digits)
    out["mean"] = round(sum(data) / len(data), digits) if data else None
    out["min"] = round(min(data), digits) if data else None
    out["max"] = round(max(data), digits) if data else None
    return out


# ------------------------------------------------------------------------------ provenance
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "ram_gib": _ram_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "packages": packages,
    }


def repo_root() -> Path:
    """The checkout the running package comes from (for ``git rev-parse``)."""
    return Path(__file__).resolve().parents[1]


def git_info(root: Path | None = None) -> dict[str, Any]:
    root = root or repo_root()

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "branch": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status), "branch": git("rev-parse", "--abbrev-ref", "HEAD")}


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as a user would type it (``realtime-omni ...`` for the console script)."""
    argv = list(sys.argv if argv is None else argv)
    if argv:
        prog = os.path.basename(argv[0])
        if prog in ("realtime-omni", "__main__.py", "cli.py"):
            argv[0] = "realtime-omni"
    return shlex.join(argv)


# ------------------------------------------------------------------------------ the report
@dataclass
class Report:
    """One benchmark run. ``summary`` holds the headline numbers, ``samples`` the raw data."""

    name: str
    benchmark: str
    title: str
    command: str
    config: dict[str, Any]
    summary: dict[str, Any]
    samples: dict[str, Any]
    #: markdown table: column titles and rows of cell values
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    #: one line shown in the index (e.g. "first audio p50 812 ms ...")
    headline: str = ""
    notes: list[str] = field(default_factory=list)
    #: extra markdown sections: (title, body)
    sections: list[tuple[str, str]] = field(default_factory=list)
    #: draws the figure; gets a fresh ``matplotlib.figure.Figure``
    plot: Callable[[Any], None] | None = None
    reproduce: list[str] = field(default_factory=list)
    started_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    duration_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "name": self.name,
            "benchmark": self.benchmark,
            "title": self.title,
            "headline": self.headline,
            "date": self.started_at,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 1),
            "command": self.command,
            "git": git_info(),
            "machine": machine_info(),
            "config": self.config,
            "summary": self.summary,
            "table": {"columns": self.columns, "rows": self.rows},
            "notes": self.notes,
            "samples": self.samples,
        }


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "\\|")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _machine_line(data: dict[str, Any]) -> str:
    m = data.get("machine", {})
    return f"{m.get('cpu')} · {m.get('usable_cores')}/{m.get('cores')} cores · {m.get('ram_gib')} GiB · {m.get('os')} · Python {m.get('python')}"


def _commit_line(data: dict[str, Any]) -> str:
    g = data.get("git") or {}
    if not g.get("commit"):
        return "unknown (not a git checkout)"
    return f"`{g['commit'][:12]}`" + (" + uncommitted changes" if g.get("dirty") else "")


def render_markdown(report: Report, data: dict[str, Any]) -> str:
    out = [f"# {report.title}", ""]
    if report.headline:
        out += [f"**{report.headline}**", ""]
    out += [
        f"- Date: {data['date']}" + (f" (ran {data['duration_s']} s)" if data.get("duration_s") else ""),
        f"- Commit: {_commit_line(data)}",
        f"- Machine: {_machine_line(data)}",
        f"- Command: `{report.command}`",
        "",
    ]
    if report.columns:
        out += [markdown_table(report.columns, report.rows), ""]
    if report.plot is not None:
        out += [f"![{report.title}]({report.name}.png)", ""]
    for title, body in report.sections:
        out += [f"## {title}", "", body.rstrip(), ""]
    if report.notes:
        out += ["## Notes", ""] + [f"- {note}" for note in report.notes] + [""]
    out += ["## Reproduce", "", "```sh", "pip install -e '.[embedded,bench]'"]
    out += report.reproduce or [report.command]
    out += ["```", "", f"Raw samples and the full configuration: [`{report.name}.json`]({report.name}.json).", ""]
    packages = data.get("machine", {}).get("packages", {})
    if packages:
        out += ["<details><summary>Package versions</summary>", "", ", ".join(f"{k} {v}" for k, v in packages.items()), "", "</details>", ""]
    return "\n".join(out)


def write_report(report: Report, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``<name>.json``/``.md``/``.png`` and refresh the folder's ``README.md`` index."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = report.to_json()
    paths = {"json": out / f"{report.name}.json", "md": out / f"{report.name}.md"}
    if report.plot is not None:
        import matplotlib

        matplotlib.use("Agg", force=True)
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 5), dpi=110, layout="constrained")
        report.plot(fig)
        fig.suptitle(f"{report.title}\n{data['date']} · commit {_commit_line(data).replace('`', '')} · "
                     f"{data['machine']['cpu']}, {data['machine']['usable_cores']} cores", fontsize=8, color="dimgray")
        paths["png"] = out / f"{report.name}.png"
        fig.savefig(paths["png"])
    paths["json"].write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    paths["md"].write_text(render_markdown(report, data), encoding="utf-8")
    paths["index"] = update_index(out)
    return paths


def update_index(out_dir: str | os.PathLike[str]) -> Path:
    """Regenerate ``README.md`` in ``out_dir`` from the report JSON files present."""
    out = Path(out_dir)
    entries = []
    for path in sorted(out.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("realtime-omni-bench/"):
            continue
        entries.append((path.stem, data))
    lines = [INDEX_HEADER]
    if not entries:
        lines.append("No reports yet: run `realtime-omni bench latency` or `realtime-omni bench capacity`.\n")
    else:
        lines.append("| Report | Benchmark | Headline | Date | Commit | Machine |")
        lines.append("|---|---|---|---|---|---|")
        for stem, data in sorted(entries, key=lambda e: (e[1].get("benchmark", ""), e[0])):
            title = data.get("title") or stem
            link = f"[{title}]({stem}.md)"
            if (out / f"{stem}.png").exists():
                link += f" ([plot]({stem}.png))"
            m = data.get("machine", {})
            machine = f"{m.get('cpu')}, {m.get('usable_cores')} cores"
            lines.append(
                f"| {link} | `{data.get('benchmark')}` | {_cell(data.get('headline'))} | {str(data.get('date', ''))[:10]} "
                f"| {_commit_line(data)} | {_cell(machine)} |"
            )
        lines.append("")
        lines.append("Commands (each report's page has the full reproduction steps):\n")
        lines.append("```sh")
        for stem, data in entries:
            lines.append(data.get("command", ""))
        lines.append("```\n")
    path = out / "README.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(update_index(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks"))
