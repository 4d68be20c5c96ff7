#!/usr/bin/env python
"""Render ``omni_capacity.py`` raw results as docs/benchmarks/omni-capacity.{json,md,png}.

    python benchmarks/omni_capacity_report.py raw.json [more.json ...] --commit SHA --gpu 'NVIDIA H200' \
        [--server 4:server.json ...] [--lookahead-run 1:raw-la1.json ...] --out docs/benchmarks

Models are taken from every raw file in order (one model per name: the last wins).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

#: before cross-session batching (every session stepping alone), measured on the same H200 with
#: the same prompt and 64-token replies: sessions → (TTFA p50 ms, chunk RTF of the median session)
BASELINE = {
    "Qwen3-Omni-30B-A3B-Instruct": {1: (437, 0.38), 2: (555, 0.68), 4: (1302, 1.35), 8: (3363, 2.69)},
    "Qwen2.5-Omni-7B": {1: (556, 0.50), 2: (812, 0.90), 4: (1393, 1.82), 8: (2834, 3.59), 16: (8266, 7.18)},
}
BASELINE_AUDIO_PER_S = {"Qwen3-Omni-30B-A3B-Instruct": 2.6, "Qwen2.5-Omni-7B": 1.25}


def _f(value, digits=0):
    if value is None:
        return "—"
    return f"{value:.{digits}f}"


def table(model: dict) -> list[str]:
    lines = ["| sessions | TTFA p50 / p95 / max (ms) | first token p50 (ms) | chunk RTF p50 / p95 / max | "
             "audio s per wall s | sessions with underruns | rows per step: thinker / talker / codec | "
             "ms per step: thinker / talker / codec | device ms per step: thinker / talker / codec | "
             "prefill batches: thinker / talker | GPU peak (GB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in model["runs"]:
        t, c, b = r["ttfa_ms"], r["chunk_rtf"], r["batches"]
        # earlier runs batched the code predictor on its own; now it is inside the talker's step
        names = ["thinker", "talker", "codec" if "codec" in b else "code predictor"]
        rows = " / ".join(_f(b[n]["mean_rows"], 1) if n in b else "—" for n in names)
        ms = " / ".join(_f(b[n]["ms_per_step"], 1) if n in b else "—" for n in names)
        dev = " / ".join(_f(b[n].get("device_ms_per_step"), 1) if n in b else "—" for n in names)
        prefills = " / ".join(f"{b[n]['steps']} × {_f(b[n]['mean_rows'], 1)}" if n in b else "—"
                              for n in ("thinker prefill", "talker prefill"))
        lines.append(f"| {r['sessions']} | {_f(t['p50'])} / {_f(t['p95'])} / {_f(t['max'])} | "
                     f"{_f(r['first_token_ms_p50'])} | {_f(c['p50'], 2)} / {_f(c['p95'], 2)} / {_f(c['max'], 2)} | "
                     f"{_f(r['audio_s_per_wall_s'], 1)} | {r['underrun_sessions']} of {r['sessions']} | {rows} | {ms} | "
                     f"{dev} | {prefills} | "
                     f"{_f(r['gpu_mem_peak_gb'], 1)} |")
    return lines


def lookahead_table(runs: list[tuple[int, list[dict]]]) -> list[str]:
    """The same levels with sessions queueing 1, 4, 12 … steps ahead per stage."""
    lines = ["## Steps queued ahead per stage (`REALTIME_OMNI_OMNI_LOOKAHEAD_STEPS`)", "",
             "Measured at earlier commits (before the codec's group graphs and the fused norms). Same model and "
             "prompt. Lookahead 1: a session hands its next step over only after reading the last "
             "one, so the sessions reach each stage's loop in waves as their threads come round; with more, each "
             "session keeps that many steps queued (the thinker chains its tokens on the device).", "",
             "| model | sessions | lookahead | audio s per wall s | TTFA p50 (ms) | chunk RTF p50 / p95 | "
             "rows per step: thinker / talker | ms per step: thinker / talker |", "|---|---|---|---|---|---|---|---|"]
    table: dict[tuple[str, int], list[tuple[int, dict]]] = {}
    for lookahead, models in runs:
        for m in models:
            for r in m.get("runs", []):
                table.setdefault((m["name"], r["sessions"]), []).append((lookahead, r))
    for (name, n), entries in sorted(table.items()):
        if len(entries) < 2:
            continue
        for lookahead, r in sorted(entries, key=lambda e: e[0]):
            b = r["batches"]
            rows = " / ".join(_f(b[k]["mean_rows"], 1) for k in ("thinker", "talker"))
            ms = " / ".join(_f(b[k]["ms_per_step"], 1) for k in ("thinker", "talker"))
            lines.append(f"| {name} | {n} | {lookahead} | {_f(r['audio_s_per_wall_s'], 1)} | {_f(r['ttfa_ms']['p50'])} | "
                         f"{_f(r['chunk_rtf']['p50'], 2)} / {_f(r['chunk_rtf']['p95'], 2)} | {rows} | {ms} |")
    return lines + [""]


def sweep_table(sweeps: list[tuple[str, list[dict]]]) -> list[str]:
    """``omni_capacity.py --sweep``: settings changed between levels of one process."""
    lines = ["## Settings compared in one process (`omni_capacity.py --sweep`)", "",
             "Each variant changes settings on the loaded model and runs its levels; the default levels of the "
             "same process are shown beside it. `pipelined` (default since `f634940`; `unpiped`: off): a loop "
             "hands a step's results over once it has launched the next step; `overlap` (removed since): steps "
             "handed over with a CUDA event, the loop preparing the next step while the device runs this one; "
             "`switch_ms`: the interpreter's thread "
             "switch interval; `frames`: codec frames per reply (192 frames for 64 text tokens is about the "
             "ratio of speech, 3–4 tokens per second; 64 frames forces one text token per 80 ms frame); "
             "`arrive_ms`: the replies start one after another at that interval instead of together; "
             "`pace_ms`: the talker's lead over real-time playback (`pace_lead_ms`; 0: as fast as the GPU "
             "goes, so audio s per wall s is what the GPU can make; paced, it is capped near N × real time "
             "by design); `first_frames` / `ramp`: the first chunks' sizes.", "",
             "| run | model | variant | sessions | audio s per wall s | TTFA p50 / p95 (ms) | chunk RTF p50 / p95 | "
             "sessions with underruns | rows per step: thinker / talker | ms per step: thinker / talker / codec |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, models in sweeps:
        for m in models:
            entries = [("default", m.get("runs", []))] + [(v["name"], v["runs"]) for v in m.get("sweep", [])]
            levels = {r["sessions"] for _, runs in entries[1:] for r in runs}
            for name, runs in entries:
                for r in runs:
                    if r["sessions"] not in levels:
                        continue
                    b, t, c = r["batches"], r["ttfa_ms"], r["chunk_rtf"]
                    rows = " / ".join(_f(b[k]["mean_rows"], 1) for k in ("thinker", "talker"))
                    ms = " / ".join(_f(b[k]["ms_per_step"], 1) if k in b else "—" for k in ("thinker", "talker", "codec"))
                    lines.append(f"| {label} | {m['name']} | {name} | {r['sessions']} | {_f(r['audio_s_per_wall_s'], 1)} | "
                                 f"{_f(t['p50'])} / {_f(t['p95'])} | {_f(c['p50'], 2)} / {_f(c['p95'], 2)} | "
                                 f"{r['underrun_sessions']} of {r['sessions']} | {rows} | {ms} |")
    return lines + [""]


def arrivals_table(sweeps: list[tuple[str, list[dict]]]) -> list[str]:
    """Sweep variants with staggered arrivals or pacing: first audio, and where the late chunks were."""
    lines = ["## Replies that start while others play (`arrive_ms`), paced or not (`pace_ms`)", "",
             "Speech-like replies (64 text tokens over 192 frames, 15.4 s). Late chunks by their place in the "
             "reply: how many sessions' 2nd / 3rd / later audio chunk came after the listener needed it, and the "
             "worst gap there (the first chunk is the first audio: never late by definition; — : not recorded "
             "by that run).", "",
             "| run | model | variant | sessions | one every (ms) | pace lead (ms) | TTFA p50 / p95 / max (ms) | "
             "chunk RTF p50 / p95 | sessions with underruns | late 2nd chunk | late 3rd chunk | late later |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, models in sweeps:
        for m in models:
            for v in m.get("sweep", []):
                st = v.get("settings", {})
                if not st.get("arrive_ms") and not st.get("pace_ms"):
                    continue
                for r in v["runs"]:
                    t, c = r["ttfa_ms"], r["chunk_rtf"]
                    cells = [_late_cell(r.get("late_by_chunk"), places) for places in (["1"], ["2"], ["3", "4", "5"])]
                    lines.append(f"| {label} | {m['name']} | {v['name']} | {r['sessions']} | {_f(st.get('arrive_ms'))} | "
                                 f"{_f(st.get('pace_ms'))} | {_f(t['p50'])} / {_f(t['p95'])} / {_f(t['max'])} | "
                                 f"{_f(c['p50'], 2)} / {_f(c['p95'], 2)} | {r['underrun_sessions']} of {r['sessions']} | "
                                 + " | ".join(cells) + " |")
    return lines + [""]


def _late_cell(late: dict | None, places: list[str]) -> str:
    """Late chunks at these places: how many, and the worst gap."""
    if late is None:
        return "—"
    hits = [late[p] for p in places if p in late]
    if not hits:
        return "0"
    return f"{sum(h['count'] for h in hits)} ({_f(max(h['ms_max'] for h in hits))} ms)"


#: what the chunk-by-chunk table's indices mean
CHUNKS_NOTE = ("Chunk #0 is the first audio (no RTF); #8+ pools the ninth and later. An underrun's index "
               "counts only chunks with audio, as here (late ones from #5 on are pooled under #5).")


def chunk_table(variants: list[tuple[str, dict]]) -> list[str]:
    """Per level, each audio chunk's RTF p95 over the sessions (its length in frames) and the
    sessions for which it came late (by at most how many ms): where the tail comes from."""
    lines = ["| variant | sessions | audio chunk: RTF p95 over sessions (frames) · late in sessions (at most ms) |",
             "|---|---|---|"]
    for label, m in variants:
        for r in m["runs"]:
            by_chunk = r.get("rtf_by_chunk") or {}
            late = r.get("late_by_chunk") or {}
            if not by_chunk and not late:
                continue
            cells = []
            for index in sorted({int(i) for i in by_chunk} | {int(i) for i in late}):
                rtf = by_chunk.get(str(index), by_chunk.get(index))
                miss = late.get(str(index), late.get(index))
                cell = f"#{index}{'+' if index == 8 else ''}: "
                cell += f"{_f(rtf['p95'], 2)} ({_f(rtf['frames'], 0)})" if rtf else "—"
                if miss:
                    cell += f" · {miss['count']} ({_f(miss['ms_max'])})"
                cells.append(cell)
            lines.append(f"| {label} | {r['sessions']} | {'; '.join(cells)} |")
    return lines


def phase_table(models: list[dict]) -> list[str]:
    """Where each decode loop's wall time went, per step: waiting for sessions' rows (idle),
    staging and launching the step on the host, waiting for the device to finish it."""
    lines = ["## Where the decode loops' time goes", "",
             "Per step of each loop, over the whole level (the first audio's prefill phase included, when the "
             "decode loops have nothing to do): idle (no session had a row queued, or the loop waited up to "
             "2 ms for the sessions mid-reply), host (staging the rows and launching the graph), device wait "
             "(until the step's kernels finished, sharing the GPU with the other stages). The sessions' threads' CPU "
             "seconds are summed over the level's sessions, by role.", "",
             "| model | sessions | level wall (s) | process CPU s per wall s | sessions' threads CPU s: thinker / talker "
             "/ codec | thinker idle / host / device wait (ms per step) | talker idle / host / device wait (ms per step) |",
             "|---|---|---|---|---|---|---|"]
    for m in models:
        for r in m.get("runs", []):
            b = r["batches"]
            if "phase_s" not in b.get("thinker", {}):
                continue
            cells = []
            for stage in ("thinker", "talker"):
                ph, steps = b[stage]["phase_s"], max(1, b[stage]["steps"])
                cells.append(" / ".join(_f(1000 * ph[k] / steps, 1) for k in ("idle", "host", "device_wait")))
            cpu = r.get("cpu_s")
            threads = r.get("session_cpu_s") or {}
            roles = " / ".join(_f(threads.get(role), 2) for role in ("thinker", "talker", "codec"))
            lines.append(f"| {m['name']} | {r['sessions']} | {_f(r['wall_s'], 2)} | "
                         f"{_f(cpu / r['wall_s'] if cpu else None, 1)} | {roles} | {cells[0]} | {cells[1]} |")
    return lines + [""]


def first_audio_table(models: list[dict]) -> list[str]:
    """A reply's first audio by phase: its turn waiting for a prefill batch and prefilled, the
    first thinker token, the talker's first codes, the codec's first audio (p50 / p95)."""
    lines = ["## First audio, phase by phase", "",
             "Milliseconds, p50 / p95 over the level's sessions. A prefill's preparation: the session's "
             "own work before queuing it (the thinker's: the turn's prompt rendered, since `audio_features.py` "
             "without the audio's features, computed in the batch on the device; the talker's: its prompt "
             "built from the thinker's first token). A prefill's wait: from its "
             "request to the start of the batch that runs it; done: until its result (the wait included). "
             "The first token, first codes and first audio count from the moment the reply is asked for; "
             "the first token comes after the thinker's preparation, its prefill and one decode step.", "",
             "| model | sessions | thinker prefill: prepared · wait · done | first token | "
             "talker prefill: prepared · wait · done | first codes | first audio |", "|---|---|---|---|---|---|---|"]

    def pair(d) -> str:
        return f"{_f((d or {}).get('p50'))} / {_f((d or {}).get('p95'))}"

    for m in models:
        for r in m.get("runs", []):
            if "first_codes_ms" not in r:
                continue
            b = r["batches"]
            think, talk = b.get("thinker prefill", {}), b.get("talker prefill", {})
            lines.append(f"| {m['name']} | {r['sessions']} | {pair(think.get('prepared_ms'))} · "
                         f"{pair(think.get('wait_ms'))} · {pair(think.get('latency_ms'))} | {pair(r['first_token_ms'])} | "
                         f"{pair(talk.get('prepared_ms'))} · {pair(talk.get('wait_ms'))} · {pair(talk.get('latency_ms'))} | "
                         f"{pair(r['first_codes_ms'])} | {pair(r['ttfa_ms'])} |")
    return lines + [""] if len(lines) > 6 else []


def server_table(server: dict, lookahead: int, note: str = "") -> list[str]:
    """``omni_server.py``: N WebSocket clients with a spoken turn each, through the real server."""
    lines = [f"## Through the real server (WebSocket clients), lookahead {lookahead}{note}", "",
             f"`realtime-omni serve --model omni:<dir>` in its own process, the model in its worker process, "
             f"{server.get('slots')} session slots, random weights (`REALTIME_OMNI_OMNI_RANDOM_WEIGHTS`); "
             f"server up and graphs captured after {_f(server.get('load_s'))} s. Each of N `/v1/realtime` clients "
             f"sends the same {_f(server.get('speech_s'), 1)} s spoken question (Piper, pcm16 24 kHz), commits it, "
             f"and all ask for a reply at once, or one every so many ms ({server.get('reply_tokens')} thinker tokens, at most "
             f"{server.get('frames')} codec frames). TTFA: `response.create` sent → first "
             "`response.output_audio.delta` received. The server paces audio to real time plus its lead, so "
             "an underrun here is what a listener hears.", "",
             "| sessions | answered | TTFA p50 / p95 / max (ms) | sessions with underruns | gap p95 (ms) | "
             "gaps in the first 0.5 s / to 1.5 s / later (longest ms) | audio s per session | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for lv in server.get("levels", []):
        t = lv["ttfa_ms"]
        every = lv.get("arrive_ms")
        label = f"{lv['sessions']}, one every {_f(every)} ms" if every else str(lv["sessions"])
        lines.append(f"| {label} | {lv['answered']} | {_f(t['p50'])} / {_f(t['p95'])} / {_f(t['max'])} | "
                     f"{lv['sessions_with_underruns']} of {lv['sessions']} | {_f(lv['gap_ms_p95'])} | "
                     f"{_gap_places(lv.get('gaps_at'))} | "
                     f"{_f(lv['audio_s_per_session'], 2)} | {', '.join(lv['errors']) or 'none'} |")
    return lines + [""]


def _gap_places(places: dict | None) -> str:
    """``omni_server.py``'s gaps by where in the reply they fell (— : not recorded by that run)."""
    if not places:
        return "—"
    return " / ".join(f"{p['count']} ({_f(p['ms_max'])})" if p["count"] else "0" for p in places.values())


def plot(models: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for m in models:
        if not m.get("runs"):
            continue
        n = [r["sessions"] for r in m["runs"]]
        ax1.plot(n, [r["audio_s_per_wall_s"] for r in m["runs"]], "o-", label=f"{m['name']} batched")
        ax2.plot(n, [r["ttfa_ms"]["p50"] for r in m["runs"]], "o-", label=f"{m['name']} batched")
        base = BASELINE.get(m["name"], {})
        if base:
            ax1.axhline(BASELINE_AUDIO_PER_S[m["name"]], ls="--", lw=1, color=ax1.lines[-1].get_color(),
                        label=f"{m['name']} alone (before)")
            ax2.plot(list(base), [v[0] for v in base.values()], "x--", color=ax2.lines[-1].get_color(),
                     label=f"{m['name']} alone (before)")
    ax1.plot([1, 64], [1, 64], ":", color="grey", label="N sessions in real time")
    ax1.set(xlabel="concurrent sessions", ylabel="audio seconds per wall second", title="Throughput")
    ax2.set(xlabel="concurrent sessions", ylabel="ms", title="Time to first audio, p50", yscale="log")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw", type=Path, nargs="+")
    ap.add_argument("--server", action="append", default=[], metavar="LOOKAHEAD:PATH[:NOTE]",
                    help="omni_server.py output, with the lookahead it ran with (and a note for the title)")
    ap.add_argument("--sweep-run", action="append", default=[], metavar="LABEL:PATH",
                    help="omni_capacity.py output with --sweep variants")
    ap.add_argument("--lookahead-run", action="append", default=[], metavar="LOOKAHEAD:PATH",
                    help="capacity runs with other --lookahead values, compared level by level")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    ap.add_argument("--sections", type=Path, default=Path(__file__).with_name("omni_capacity_sections.md"))
    ap.add_argument("--summary", type=Path, default=Path(__file__).with_name("omni_capacity_summary.md"),
                    help="the targets met and missed, placed before the tables")
    args = ap.parse_args(argv)
    by_name: dict[str, dict] = {}
    for path in args.raw:
        for m in json.loads(path.read_text())["models"]:
            by_name[m.get("name", str(path))] = m
    models = list(by_name.values())
    md = ["# Omni engine: live sessions on one GPU (cross-session batching)", "",
          f"Machine: {args.gpu}, host with 16 cores. Commit `{args.commit[:12]}`. "
          f"Generated {time.strftime('%Y-%m-%d')} by `benchmarks/omni_capacity_report.py`.", "",
          "N sessions are opened, then N replies start together: the shared prompt of the GPU report "
          "(about 120 tokens with 2 s of speech), replies forced to 64 thinker tokens, random bf16 weights "
          "at real size, the talker unpaced (`--pace-ms 0`: what the GPU can make; the server paces, see "
          "\"Replies that start while others play\"). Chunk RTF: wall time between two audio chunks over the later one's duration (the time a chunk took to make over the audio it holds) "
          "(per session its median, p95 and worst, then over sessions). An underrun: a chunk ready after "
          "the listener, who started at the first audio, would have needed it.", ""]
    if args.summary.exists():
        md += [args.summary.read_text().strip(), ""]
    for m in models:
        md += [f"## {m['name']}", ""]
        if "runs" not in m:
            md += [f"No result (exit {m.get('exit')}).", ""]
            continue
        kv = m.get("batching", {}).get("kv_bytes_per_session")
        if m.get("commit"):  # a model not re-run at this report's commit keeps its own
            md += [f"Measured at commit `{m['commit']}` (not re-run for this report).", ""]
        md += [f"{m['slots']} session slots; KV per session {_f(kv / 2**20 if kv else None, 0)} MiB "
               f"(thinker context {m.get('cache_tokens', 1024)} tokens); model built and every bucket graph "
               f"captured in {_f(m.get('build_s'), 0)} s; GPU memory after load {_f(m.get('gpu_mem_after_load_gb'), 1)} GB; "
               f"torch {m['versions']['torch']}, transformers {m['versions']['transformers']}; steps queued ahead per "
               f"stage: {m.get('lookahead', 4)}. Ms per step: the loop's wall time; device ms: the span of its "
               "CUDA events (both include waiting for the other stages' kernels on the shared GPU).", ""]
        md += table(m) + [""]
        chunks = chunk_table([(m["name"], m)])
        if len(chunks) > 2:  # runs since the fourteenth session record each chunk's RTF
            md += ["Chunk by chunk. " + CHUNKS_NOTE, ""] + chunks + [""]
        estimate = m.get("capacity_estimate")
        if estimate:  # what the engine's admission would allow, from the steps timed at load
            md += [f"The engine's own estimate at load (its admission, `batching/capacity.py`): {estimate['line']}.", ""]
        graphs = m.get("graphs", {})
        if "thinker prefill" in graphs:
            md += [f"Prefill graphs captured at load: thinker {graphs['thinker prefill']}, talker "
                   f"{graphs['talker prefill']} (rows × tokens × columns buckets); decode graphs: thinker "
                   f"{graphs.get('thinker')}, talker {graphs.get('talker')}.", ""]
        check = m.get("check_alone")
        if check:
            where = check.get("first_difference")
            differ = f" (from token {where} on)" if where is not None else ""
            md += [f"12-token reply, batched vs a session stepping alone: greedy thinker tokens equal: "
                   f"{check.get('tokens_equal')}{differ}. In bf16 on the GPU this has come out both ways from "
                   "run to run; the CPU tests check tokens, codes and audio for exact equality in float32.", ""]
        base = BASELINE.get(m["name"])
        if base:
            md += ["Before (each session alone): " + ", ".join(
                f"N={n}: TTFA {t} ms, RTF {r}" for n, (t, r) in base.items())
                + f"; about {BASELINE_AUDIO_PER_S[m['name']]} audio s per wall s at any N.", ""]
    md += phase_table(models)
    md += first_audio_table(models)
    la_runs = [(int(k), json.loads(Path(v).read_text())["models"]) for k, v in (a.split(":", 1) for a in args.lookahead_run)]
    if la_runs:
        md += lookahead_table(la_runs)
    sweeps = [(label, json.loads(Path(v).read_text())["models"]) for label, v in (a.split(":", 1) for a in args.sweep_run)]
    if sweeps:
        md += sweep_table(sweeps)
        md += arrivals_table(sweeps)
    servers = []
    for arg in args.server:
        k, path, *note = arg.split(":", 2)
        servers.append((int(k), json.loads(Path(path).read_text()), note[0] if note else ""))
    for lookahead, server, note in servers:
        md += server_table(server, lookahead, f" ({note})" if note else "")
    if args.sections.exists():
        md += [args.sections.read_text().strip(), ""]
    md += ["## Reproduce", "", "```sh",
           "mkdir -p .omni_cfg .whl && cp -r ../shared/model_configs/Qwen2.5-Omni-7B ../shared/model_configs/Qwen3-Omni-30B-A3B-Instruct .omni_cfg/",
           "python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
           "--platform manylinux2014_x86_64 -d .whl transformers==5.24.0 'regex>=2025.10.22'",
           "# .whl_min: pydantic, pydantic-core, pydantic-settings, python-dotenv, typing-inspection, "
           "annotated-types, typing-extensions, soxr (docs/gpu-machine.md)",
           "# on the GPU machine (carry .whl, .whl_min and .omni_cfg):",
           "python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .whl_min/*.whl && export PYTHONPATH=/tmp/site:$PWD",
           "python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json "
           "--sessions 1 8 16 32 48 64 --sweep speech:frames=192 --sweep-sessions 32 64 "
           "--timeouts 270 --out q3-levels.json",
           "python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json "
           "--sessions 1 2 4 8 16 32 48 64 --sweep speech:frames=192 eager:eager_prefill=1 --sweep-sessions 32 64 "
           "--timeouts 320 --out q3-prefill-graphs.json   # the prefill graphs against eager prefills, one process",
           "python3 benchmarks/omni_prefill_profile.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json "
           "--sessions 1 8 16 32 --profile 16 --out prefill.json   # prefills alone: time, launches, host waits by line",
           "python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json "
           "--sessions 1 8 16 32 --timeouts 250 --out q25.json",
           "python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json "
           "--sessions 32 --sweep budget:prefill_tokens=8192 budget_speech:prefill_tokens=8192,frames=192 "
           "--sweep-sessions 32 64 --out q3b.json",
           "python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json "
           "--sessions 1 8 16 32 64 --check-alone --sweep unpiped:pipelined=0 speech:frames=192 "
           "speech_unpiped:frames=192,pipelined=0 --sweep-sessions 32 64 --out q3.json   # this commit's main table "
           "and sweep (older sweeps ran the commands of their commits)",
           "python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json "
           "--sessions 1 8 16 32 64 --check-alone --sweep arr:frames=192,arrive_ms=200 "
           "arr_paced:frames=192,arrive_ms=200,pace_ms=1500 speech:frames=192 --sweep-sessions 32 64 "
           "--out q3.json   # this commit's main table (unpaced: what the GPU can make) and the pacing sweep",
           "python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json "
           "--sessions 1 8 16 32 64 --sweep off:burst_ms=0 --sweep-sessions 16 32 64 --out q3_burst.json   "
           "# the burst of prefills gathered into one batch against not (scripts/gpu-next.sh qwen3-burst; "
           "each level's timeline in the JSON)",
           "python3 benchmarks/omni_step_profile.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json "
           "--buckets 1 8 16 32 64 --together --show 0 --out step.json   # each stage's step alone, and the stages' "
           "steps replayed together (own streams / one stream)",
           "# through the server: carry .whl_tf (transformers as a tar.xz: the wheels no longer fit beside the "
           "server's) and .whl_server (docs/gpu-machine.md), and a spoken question made here:",
           "# python -c \"import numpy as n, sys; sys.path[:0]=['benchmarks']; "
           "from omni_server import speech; n.save('.omni_cfg/turn.npy', speech(None))\"",
           "mkdir -p /tmp/site && tar -xJf .whl_tf/transformers.tar.xz -C /tmp/site && python3 -m pip install -q --no-index "
           "--no-deps --target /tmp/site .whl_tf/*.whl .whl_server/*.whl",
           "mkdir -p /tmp/q3 && cp .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json /tmp/q3/config.json",
           "python3 benchmarks/omni_server.py --model-dir /tmp/q3 --random-weights --sessions 8 32 32@150 --slots 40 "
           "--speech .omni_cfg/turn.npy --out server.json   # --pace-ms 0: the engine unpaced",
           "# here again (la*.json, server-before.json: the earlier runs kept in docs/benchmarks/omni-capacity.json):",
           "python benchmarks/omni_capacity_report.py q3.json q25.json --commit SHA --gpu 'NVIDIA H200 (143771 MiB)' "
           "--lookahead-run 1:la1.json --lookahead-run 4:la4.json --lookahead-run 12:la12.json "
           "--sweep-run 'LABEL:sweepN.json' ... --sweep-run 'this commit (SHA):q3.json' "
           "--server '12:serverN.json:NOTE' ... --server 12:server.json   # earlier inputs: extract them from "
           "docs/benchmarks/omni-capacity.json (lookahead_runs, sweeps, servers)",
           "```", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "omni-capacity.md").write_text("\n".join(md))
    heads = []
    for m in models:
        runs = {r["sessions"]: r for r in m.get("runs", [])}
        if runs:
            top = max(runs)
            heads.append(f"{m['name']}: TTFA p50 {_f(runs[min(runs)]['ttfa_ms']['p50'])} ms alone, "
                         f"{_f(max(r['audio_s_per_wall_s'] for r in runs.values()), 1)} audio s per wall s at best "
                         f"(before: {BASELINE_AUDIO_PER_S.get(m['name'])}), chunk RTF p50 "
                         f"{_f(runs[top]['chunk_rtf']['p50'], 2)} at N={top}")
    doc = {"schema": "realtime-omni-bench/1", "name": "omni-capacity", "benchmark": "omni-capacity",
           "title": "Omni engine: live sessions on one H200 (cross-session batching, random weights)",
           "headline": "; ".join(heads), "date": time.strftime("%Y-%m-%d"),
           "git": {"commit": args.commit[:12], "dirty": False},
           "machine": {"cpu": f"{args.gpu} host", "usable_cores": 16, "cores": 16, "ram_gib": 128, "gpu": args.gpu},
           "command": "python3 benchmarks/omni_capacity.py --config <Qwen3-Omni-30B-A3B config> --config "
                      "<Qwen2.5-Omni-7B config> --sessions 1 8 16 32 48 64 --check-alone --out cap.json",
           "baseline": {k: {str(n): v for n, v in b.items()} for k, b in BASELINE.items()}, "models": models,
           "lookahead_runs": {str(k): v for k, v in la_runs}, "sweeps": {label: v for label, v in sweeps},
           "servers": [{"lookahead": k, "note": note, **v} for k, v, note in servers]}
    (args.out / "omni-capacity.json").write_text(json.dumps(doc, indent=1, default=float))
    plot(models, args.out / "omni-capacity.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
