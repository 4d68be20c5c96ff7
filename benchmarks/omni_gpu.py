#!/usr/bin/env python
"""Time to first audio and per-chunk real-time factor of the streaming omni engine on a GPU.

Builds the real-size model from a (reconstructed) config on the meta device, materializes random
bf16 weights on CUDA (``to_empty`` + the model's own ``_init_weights``) and drives one response at
concurrency 1 the way the pipeline does: think() in one thread, talk() in a second, decode() in a
third, connected by queues. The prompt is a system message plus one user turn with speech audio and
text (about 120 tokens); the reply is forced to exactly ``--reply-tokens`` tokens and the talker to
a fixed number of frames (random weights would stop at arbitrary points). Then the reference
one-shot ``generate`` of the same prompt and lengths is timed (audio exists only when it returns).

    python benchmarks/omni_gpu.py --config /path/config.reconstructed.json --out results.json

Several ``--config`` run one after another in the same process (each freed before the next).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _pct(values, q):
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def build_request(model, prompt_tokens: int, audio_seconds: float, reply_tokens: int):
    from realtime_omni.engines.base import ThinkRequest, TurnMessage

    rng = np.random.default_rng(0)
    t = np.arange(int(16_000 * audio_seconds)) / 16_000
    speech = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
              + 0.03 * rng.standard_normal(t.size))
    audio = (speech * 32767).astype(np.int16)
    session = model.open_session()
    renderer = session.thinker.renderer
    system = session.thinker._target(ThinkRequest("You are a helpful voice assistant.", [], reply_tokens,
                                                  "alloy", True))
    # pad the user text until the whole prompt is about `prompt_tokens`
    words = "please tell me about the weather and the news today in a few words ".split()
    text = ""
    i = 0
    while True:
        msg = TurnMessage(role="user", text=text, audio=audio)
        n = (sum(len(renderer.render(m).ids) for m in system) + len(renderer.render(msg).ids)
             + len(renderer.header("assistant")))
        if n >= prompt_tokens or i > 400:
            break
        text += ("" if not text else " ") + words[i % len(words)]
        i += 1
    session.close()
    req = ThinkRequest(instructions="You are a helpful voice assistant.", messages=[msg],
                       max_output_tokens=reply_tokens, voice="alloy", want_audio=True)
    return req, msg, n


def stream_once(model, req, session=None, start=None, t0=None):
    """One response through three threads (thinker → talker → codec); returns timings.

    With ``session`` given it is used (and left open); ``start`` (a barrier) lines the clock up
    with other responses started together; ``t0`` (``perf_counter`` time) is when the reply was
    asked for, if earlier than now (timings count from it)."""
    own = session is None
    if own:
        session = model.open_session()
    if start is not None:
        start.wait()
    q_think: queue.Queue = queue.Queue(maxsize=1024)
    q_codes: queue.Queue = queue.Queue(maxsize=256)
    cancelled = threading.Event()
    marks: dict[str, float] = {}
    tokens: list[int] = []
    codes: list = []
    waves: list = []
    chunks: list[dict] = []
    talk_log: list[dict] = []
    errors: list[BaseException] = []
    t0 = time.perf_counter() if t0 is None else t0

    def thinker():
        try:
            for out in session.think(req):
                if "first_token" not in marks:
                    marks["first_token"] = time.perf_counter()
                if out.hidden.token_id is not None and out.hidden.token_id >= 0:
                    tokens.append(int(out.hidden.token_id))
                q_think.put(out)
            marks["thinker_done"] = time.perf_counter()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            q_think.put(None)

    def talker():
        pending, done = [], False
        try:
            while not done:
                item = q_think.get()
                items = [item]
                while True:  # take everything available (what talk_boundary hands over)
                    try:
                        items.append(q_think.get_nowait())
                    except queue.Empty:
                        break
                for it in items:
                    if it is None:
                        done = True
                    else:
                        pending.append(it)
                final = done or any(o.hidden.end for o in pending)
                n = session.talk_boundary(pending, final)
                segment, pending = pending[:n], pending[n:]
                start = time.perf_counter()
                for out in session.talk(segment, "alloy", cancelled, final):
                    now = time.perf_counter()
                    talk_log.append({"frames": len(out.codes), "talk_s": now - start, "at_s": now - t0})
                    if "first_codes" not in marks:
                        marks["first_codes"] = now
                    if out.codes is not None:
                        codes.append(out.codes.codes.clone())
                    q_codes.put(out)
                    start = time.perf_counter()
                if final:
                    done = True
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            q_codes.put(None)

    def codec():
        try:
            while True:
                out = q_codes.get()
                if out is None:
                    break
                start = time.perf_counter()
                pcm = session.decode(out)
                end = time.perf_counter()
                waves.append(pcm)
                if pcm.size and "first_audio" not in marks:
                    marks["first_audio"] = end
                chunks.append({"frames": len(out.codes), "samples": int(pcm.size), "decode_s": end - start,
                               "ready_s": end - t0, "final": bool(out.final)})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    cpu_s: dict[str, float] = {}

    def timed(role, fn):  # the thread's own CPU time: what it asked of the interpreter and the driver
        def run():
            start = time.thread_time()
            try:
                fn()
            finally:
                cpu_s[role] = time.thread_time() - start
        return run

    threads = [threading.Thread(target=timed(role, f), daemon=True)
               for role, f in (("thinker", thinker), ("talker", talker), ("codec", codec))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t_end = time.perf_counter()
    outputs_prefill = session.last_prefill_tokens
    reply_start = session.last_reply_start
    graphs = graph_status(model, session)
    if own:
        session.close()
    if errors:
        raise errors[0]
    rel = {k: v - t0 for k, v in marks.items()}
    audio_s = [c["samples"] / 24_000 for c in chunks]
    # streaming RTF of chunk i: wall time between audio i-1 and audio i being ready / its duration
    rtf = []
    prev = rel.get("first_audio")
    for c, dur in zip(chunks, audio_s, strict=True):
        if dur <= 0:
            continue
        if prev is None or c["ready_s"] == prev:
            continue
        rtf.append((c["ready_s"] - prev) / dur)
        prev = c["ready_s"]
    decode_rtf = [c["decode_s"] / d for c, d in zip(chunks, audio_s, strict=True) if d > 0]
    frames_total = sum(c["frames"] for c in chunks)
    return {
        "graphs": graphs,
        "tokens": tokens,
        "codes": [c.tolist() for c in codes],
        "wave": np.concatenate(waves) if waves else np.zeros(0, np.int16),
        "ttfa_ms": 1000 * rel["first_audio"] if "first_audio" in rel else None,
        "thread_cpu_s": cpu_s,
        "first_token_ms": 1000 * rel.get("first_token", float("nan")),
        "first_codes_ms": 1000 * rel.get("first_codes", float("nan")),
        "thinker_done_ms": 1000 * rel.get("thinker_done", float("nan")),
        "total_ms": 1000 * (t_end - t0),
        "audio_s": float(sum(audio_s)),
        "frames": frames_total,
        "prefilled_tokens": outputs_prefill,
        # from the prefill's return to the first token: the talker prompt, the pick, the state's load
        "reply_start_ms": None if reply_start is None else {
            "prompt": 1000 * reply_start.prompt_s, "pick": 1000 * reply_start.pick_s, "load": 1000 * reply_start.load_s},
        "overall_rtf": (t_end - t0 - rel.get("first_audio", 0.0)) / max(1e-9, sum(audio_s[1:]))
        if len(audio_s) > 1 else None,
        "chunk_rtf_p50": _pct(rtf, 50), "chunk_rtf_p95": _pct(rtf, 95), "chunk_rtf_max": max(rtf) if rtf else None,
        "decode_rtf_p50": _pct(decode_rtf, 50), "decode_rtf_p95": _pct(decode_rtf, 95),
        "talker_ms_per_frame": 1000 * sum(t["talk_s"] for t in talk_log) / max(1, sum(t["frames"] for t in talk_log)),
        "chunks": chunks,
        "talk_log": talk_log,
    }


def graph_status(model, session) -> dict:
    """Which steps ran as replayed CUDA graphs in this session."""
    decoder = session.thinker.ctx.decoder
    talker = session.talker
    if model.batching is not None:  # the batched stages' graphs, captured per bucket at load
        return {**{f"{b.name} batches": b.stats()["graphs"] for b in model.batching.batchers},
                "codec_windows": model.codec.windows.captured}
    return {
        "thinker_step": decoder is not None and decoder.graph is not None and decoder.graph.captured,
        "talker_step": (talker.decoder is not None and talker.decoder.graph is not None
                        and talker.decoder.graph.captured),
        "code_predictor_frame": talker.frames.graph.captured if talker.frames is not None else None,
        "codec_windows": model.codec.windows.captured,
    }


def set_graphs(model, on: bool) -> None:
    model.cuda_graphs = on
    model.thinker_settings.cuda_graphs = on
    model.talker_settings.cuda_graphs = on
    model.codec.windows.enabled = on


def check_graphs(model, req) -> dict:
    """The same short response with CUDA graphs and eagerly: tokens, codes and audio must agree
    (same seed, same kernels), and the eager run's timings are the before/after baseline."""
    short = type(req)(req.instructions, req.messages, 16, req.voice, True)
    sampling = model.talker_settings.do_sample
    model.talker_settings.do_sample = False  # greedy: the comparison is not at the mercy of draws
    try:
        graphed = stream_once(model, short)
        set_graphs(model, False)
        eager = stream_once(model, short)
    finally:
        set_graphs(model, True)
        model.talker_settings.do_sample = sampling
    n = min(graphed["wave"].size, eager["wave"].size)
    diff = np.abs(graphed["wave"][:n].astype(np.int32) - eager["wave"][:n].astype(np.int32))
    return {
        "reply_tokens": 16,
        "talker": "greedy",
        "tokens_equal": graphed["tokens"] == eager["tokens"],
        "codes_equal": graphed["codes"] == eager["codes"],
        "samples": [int(graphed["wave"].size), int(eager["wave"].size)],
        "audio_max_abs_diff_int16": int(diff.max()) if n else None,
        "graphed": {k: graphed[k] for k in ("graphs", "ttfa_ms", "chunk_rtf_p50", "talker_ms_per_frame")},
        "eager": {k: eager[k] for k in ("graphs", "ttfa_ms", "chunk_rtf_p50", "talker_ms_per_frame")},
    }


def one_shot(model, msg, reply_tokens: int, frames: int):
    """The reference ``generate`` for the same prompt, forced to the same lengths."""
    import torch

    from realtime_omni.engines.omni.audio_features import log_mel

    loaded = model.loaded
    session = model.open_session()
    r = session.thinker.renderer
    system = session.thinker._target(
        __import__("realtime_omni.engines.base", fromlist=["ThinkRequest"]).ThinkRequest(
            "You are a helpful voice assistant.", [], reply_tokens, "alloy", True))
    ids = []
    for m in system:
        ids += r.render(m).ids
    rendered = r.render(msg)
    ids += rendered.ids + r.header("assistant")
    session.close()
    device = loaded.device
    feats = log_mel(loaded.feature_extractor, rendered.audio_clips, device)[0][None].to(loaded.dtype)
    kw = dict(input_ids=torch.tensor([ids], device=device), input_features=feats,
              feature_attention_mask=torch.ones((1, feats.shape[-1]), dtype=torch.long, device=device),
              thinker_max_new_tokens=reply_tokens, thinker_min_new_tokens=reply_tokens,
              talker_max_new_tokens=frames, talker_min_new_tokens=frames)
    kw["speaker"] = loaded.default_speaker
    if loaded.arch == "qwen2_5_omni":
        loaded.model.speaker_map = dict(loaded.speakers)
        # a random talker samples ids the DiT cannot embed (>= num_embeds + 1, e.g. the mask id);
        # the streaming engine suppresses them, so ban them here too
        first_bad = int(loaded.config.token2wav_config.dit_config.num_embeds) + 1
        vocab = int(loaded.config.talker_config.vocab_size)
        if first_bad < vocab:
            kw["talker_bad_words_ids"] = [[i] for i in range(first_bad, vocab)]
    _sync()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = loaded.model.generate(**kw)
    _sync()
    wall = time.perf_counter() - t0
    wav = out[1]
    if isinstance(wav, (list, tuple)):
        wav = wav[0]
    samples = int(wav.reshape(-1).shape[0])
    return {"time_to_audio_ms": 1000 * wall, "audio_s": samples / 24_000, "prompt_tokens": len(ids)}


def run_config(path: Path, args) -> dict:
    import torch
    import transformers

    from realtime_omni.engines.omni import OmniModel
    from realtime_omni.engines.omni.loader import detect_architecture
    from realtime_omni.engines.settings import OmniSettings

    raw = json.loads(path.read_text())
    arch = detect_architecture(raw, where=str(path))
    result: dict = {"config": str(path), "arch": arch, "name": path.parent.name}
    t0 = time.perf_counter()
    # the system prompt is kept short: the benchmark's byte-level stand-in tokenizer would make
    # Qwen2.5's official system prompt ~190 tokens instead of ~40
    settings = OmniSettings(device=args.device, dtype=args.dtype, ignore_eos=True, system_prompt="",
                            max_new_tokens=args.reply_tokens, talker_max_frames=args.frames + 1,
                            first_chunk_frames=args.first_chunk_frames, chunk_frames=args.chunk_frames,
                            left_context_frames=args.left_context_frames, seed=0, cuda_graphs=args.graphs,
                            realtime_admission="off")  # (the ramp opens what it measures)
    model = OmniModel.random(path, settings, model_id=path.parent.name)
    _sync()
    result["build_s"] = time.perf_counter() - t0
    loaded = model.loaded
    result["params"] = {
        "total": sum(p.numel() for p in loaded.model.parameters()),
        "thinker": sum(p.numel() for p in loaded.model.thinker.parameters()),
        "talker": sum(p.numel() for p in loaded.model.talker.parameters()),
    }
    if torch.cuda.is_available():
        result["gpu_mem_allocated_gb"] = torch.cuda.memory_allocated() / 1e9
    result["chunking"] = {"first_chunk_frames": model.first_chunk_frames, "chunk_frames": model.chunk_frames,
                          "left_context_frames": model.left_context_frames,
                          "lookahead_frames": model.lookahead_frames, "crossfade_ms": model.crossfade_ms,
                          "frame_ms": 1000 * model.codec.samples_per_code / 24_000}
    req, msg, n_prompt = build_request(model, args.prompt_tokens, args.audio_seconds, args.reply_tokens)
    result["prompt_tokens"] = n_prompt
    result["reply_tokens"] = args.reply_tokens
    result["audio_in_s"] = args.audio_seconds
    # warm-up (CUDA context, cuBLAS handles, allocator): a short response, not measured
    warm = type(req)(req.instructions, req.messages, 4, req.voice, True)
    t = time.perf_counter()
    stream_once(model, warm)
    result["warmup_s"] = time.perf_counter() - t
    runs = []
    for _ in range(args.repeats):
        runs.append(stream_once(model, req))
    for r in runs:
        del r["wave"], r["codes"]
    result["streaming"] = runs
    try:
        result["experts_implementation"] = loaded.model.get_experts_implementation()
    except Exception as exc:  # noqa: BLE001
        result["experts_implementation"] = repr(exc)[:200]
    if args.check_graphs:
        try:
            check = check_graphs(model, req)
        except Exception as exc:  # noqa: BLE001
            check = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        result["graph_check"] = check
        print(json.dumps(check, indent=1, default=float), flush=True)
    best = runs[-1]
    result["summary"] = {
        "ttfa_ms": [r["ttfa_ms"] for r in runs],
        "first_token_ms": [r["first_token_ms"] for r in runs],
        "chunk_rtf_p50": [r["chunk_rtf_p50"] for r in runs],
        "chunk_rtf_p95": [r["chunk_rtf_p95"] for r in runs],
        "overall_rtf": [r["overall_rtf"] for r in runs],
        "talker_ms_per_frame": [r["talker_ms_per_frame"] for r in runs],
        "decode_rtf_p50": [r["decode_rtf_p50"] for r in runs],
        "graphs": best["graphs"],
        "thinker_ms_per_token": [
            (r["thinker_done_ms"] - r["first_token_ms"]) / max(1, len(r["tokens"]) - 1) for r in runs],
        "audio_s": best["audio_s"],
        "frames": best["frames"],
    }
    if args.partial is not None:  # keep the streaming numbers even if the one-shot run fails
        args.partial.write_text(json.dumps(result, indent=1, default=float))
    if args.one_shot:
        try:
            result["one_shot"] = one_shot(model, msg, args.reply_tokens, args.frames + 1)
        except Exception as exc:  # noqa: BLE001
            result["one_shot"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    if args.partial is not None:
        args.partial.write_text(json.dumps(result, indent=1, default=float))
    model.close()
    del model, loaded
    gc.collect()
    return result


def run_isolated(cmd: list[str], part: Path, config: Path, budget: float | None) -> dict:
    """One model's run in a process of its own (a CUDA fault or a time-out there leaves the other
    models' numbers intact): what it wrote to ``part`` (partial results too), and its exit code
    when it did not end cleanly."""
    import subprocess

    try:
        rc: int | str = subprocess.run(cmd, timeout=budget).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    res = json.loads(part.read_text()) if part.exists() else {"config": str(config)}
    if rc != 0:
        res["exit"] = rc
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", action="append", required=True, type=Path, help="config.json (repeatable)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt-tokens", type=int, default=120)
    ap.add_argument("--audio-seconds", type=float, default=2.0)
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--frames", type=int, default=None, help="talker frames (default: covers the reply)")
    ap.add_argument("--first-chunk-frames", type=int, default=None)
    ap.add_argument("--chunk-frames", type=int, default=None)
    ap.add_argument("--left-context-frames", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-one-shot", dest="one_shot", action="store_false")
    ap.add_argument("--no-graphs", dest="graphs", action="store_false", help="eager stages (the old baseline)")
    ap.add_argument("--check-graphs", action="store_true",
                    help="also run a short reply with and without CUDA graphs and compare the outputs")
    ap.add_argument("--timeouts", type=float, nargs="*", help="seconds per model (one per --config)")
    ap.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dump-stacks-after", type=float, default=None,
                    help="print every thread's stack after this many seconds (finding a hang)")
    ap.add_argument("--partial", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    import torch

    report = {
        "host": platform.node(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "args": {k: (str(v) if isinstance(v, Path) else [str(x) for x in v] if isinstance(v, list) else v)
                 for k, v in vars(args).items()},
        "models": [],
    }
    if args.single:
        if args.dump_stacks_after:
            import faulthandler

            faulthandler.dump_traceback_later(args.dump_stacks_after, exit=False)
        path = args.config[0]
        raw = json.loads(path.read_text())
        if args.frames is None:
            # enough frames to speak part of the reply: Qwen2.5 codes are 20 ms, Qwen3 frames 80 ms
            args.frames = 3 * args.reply_tokens if raw.get("model_type") == "qwen2_5_omni" else args.reply_tokens
        print(f"== {path} ({args.frames} frames)", flush=True)
        res = run_config(path, args)
        args.out.write_text(json.dumps(res, indent=1, default=float))
        return 0
    # one process per model: a CUDA fault or a time-out in one leaves the others' numbers intact

    for i, path in enumerate(args.config):
        part = args.out.with_suffix(f".{i}.json")
        cmd = [sys.executable, __file__, "--single", "--config", str(path), "--out", str(part),
               "--partial", str(part), "--device", args.device, "--dtype", args.dtype,
               "--prompt-tokens", str(args.prompt_tokens), "--audio-seconds", str(args.audio_seconds),
               "--reply-tokens", str(args.reply_tokens), "--repeats", str(args.repeats)]
        for flag, value in (("--frames", args.frames), ("--first-chunk-frames", args.first_chunk_frames),
                            ("--chunk-frames", args.chunk_frames), ("--left-context-frames", args.left_context_frames)):
            if value is not None:
                cmd += [flag, str(value)]
        if not args.one_shot:
            cmd.append("--no-one-shot")
        if not args.graphs:
            cmd.append("--no-graphs")
        if args.check_graphs:
            cmd.append("--check-graphs")
        res = run_isolated(cmd, part, path, args.timeouts[i] if args.timeouts and i < len(args.timeouts) else None)
        report["models"].append(res)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=float))
        brief = {k: res.get(k) for k in ("name", "build_s", "prompt_tokens", "summary", "one_shot", "exit")}
        print(json.dumps(brief, indent=1, default=float), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
