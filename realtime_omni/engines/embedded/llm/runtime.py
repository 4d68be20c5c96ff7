"""The decoder on ONNX Runtime: one shared inference session, one context cache per conversation.

The graph is built from the GGUF file at the first load and kept in a cache directory with the
file's tokenizer tables, so later starts only read them back (~0.5 s instead of ~6 s). ``InferenceSession.run`` is thread-safe and releases the GIL, so the
conversations of all sessions share one copy of the weights and run side by side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .shape import CACHE_DTYPE, LlamaShape, past_name, present_name
from .tokenizer import BpeTokenizer

#: bump when the graph changes: cached graphs of another version are rebuilt
GRAPH_VERSION = 1
#: prompt tokens evaluated per run: bounds the attention scores' memory (heads × chunk × context)
PREFILL_CHUNK = 256


def _write_atomically(path: Path, data: bytes) -> None:
    """A concurrent start or a crash never leaves half a file under the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class DecoderRuntime:
    """The model file's shape, tokenizer and one ONNX Runtime session over its graph."""

    def __init__(self, path: str | Path, threads: int, context_tokens: int, cache_dir: Path | None,
                 progress: Callable[[str], None] = lambda _m: None) -> None:
        self.path = Path(path)
        self.context_tokens = context_tokens
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        graph, tables = self._graph(cache_dir, progress)
        self.shape = LlamaShape(**tables["shape"])
        self.tokenizer = BpeTokenizer(tables["tokens"], tables["token_types"], tables["merges"])
        self.session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        self._outputs = ["logits"] + [present_name(i, kind) for i in range(self.shape.layers) for kind in ("key", "value")]
        self._guidance = None
        self._guidance_lock = threading.Lock()

    def _graph(self, cache_dir: Path | None, progress: Callable[[str], None]) -> tuple[bytes | str, dict]:
        """The graph (a file path when cached) and the file's tables (shape, tokenizer).

        Both are kept in ``cache_dir``: reading the GGUF file's 49k-entry vocabulary with the
        ``gguf`` package alone takes ~2 s, the graph's build ~4 s."""
        stat = self.path.stat()
        key = hashlib.sha256(f"{GRAPH_VERSION}:{self.path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:"
                             f"{self.context_tokens}".encode()).hexdigest()[:16]
        name = f"{self.path.stem}-{key}"
        graph_file = cache_dir / f"{name}.onnx" if cache_dir is not None else None
        tables_file = cache_dir / f"{name}.json" if cache_dir is not None else None
        if graph_file is not None and tables_file is not None and graph_file.is_file():
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                tables = json.loads(tables_file.read_text())
                LlamaShape(**tables["shape"])  # a truncated or foreign file is rebuilt
                return str(graph_file), tables
        progress(f"building the ONNX graph of {self.path.name} (once; kept in {cache_dir})")
        from .gguf_weights import GgufLlama  # only a first start needs gguf and onnx
        from .graph import build_graph
        weights = GgufLlama(self.path)
        tables = {"shape": dataclasses.asdict(weights.shape), "tokens": weights.tokens(),
                  "token_types": weights.token_types(), "merges": weights.merges()}
        data = build_graph(weights, max_positions=self.context_tokens).SerializeToString()
        if graph_file is not None and tables_file is not None:
            try:
                _write_atomically(graph_file, data)
                _write_atomically(tables_file, json.dumps(tables).encode())
                for stale in [*cache_dir.glob(f"{self.path.stem}-*.onnx"), *cache_dir.glob(f"{self.path.stem}-*.json")]:
                    if stale not in (graph_file, tables_file):  # another version or context size
                        with contextlib.suppress(OSError):
                            stale.unlink()
            except OSError as exc:
                progress(f"could not keep the graph in {cache_dir} ({exc}); it is built at every start")
        return data, tables

    def empty_past(self) -> list[np.ndarray]:
        s = self.shape
        return [np.zeros((1, s.kv_heads, 0, s.head_dim), dtype=CACHE_DTYPE) for _ in range(2 * s.layers)]

    def run(self, ids: Sequence[int], past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        feeds = {"input_ids": np.asarray([ids], dtype=np.int64)}
        for i in range(self.shape.layers):
            feeds[past_name(i, "key")] = past[2 * i]
            feeds[past_name(i, "value")] = past[2 * i + 1]
        logits, *present = self.session.run(self._outputs, feeds)
        return logits[0, -1], present

    def guidance_tokenizer(self):
        """llguidance's view of the vocabulary (built on first use: ~0.2 s)."""
        with self._guidance_lock:
            if self._guidance is None:
                import llguidance

                self._guidance = llguidance.LLTokenizer(self.tokenizer.to_json(), n_vocab=self.tokenizer.vocab_size,
                                                        eos_token=self.tokenizer.special("<|im_end|>"))
            return self._guidance


class ContextCache:
    """One conversation's evaluated tokens and their keys/values, reused across turns.

    A new prompt that shares a prefix with what was evaluated keeps that prefix's keys/values
    and evaluates only the rest, the way llama.cpp's ``generate`` reuses its cache.
    """

    def __init__(self, runtime: DecoderRuntime) -> None:
        self._runtime = runtime
        self.tokens: list[int] = []
        self._past = runtime.empty_past()
        self._logits: np.ndarray | None = None  # after the last evaluated token
        #: tokens evaluated over this cache's life (prompts and generated tokens)
        self.evaluated = 0

    def pending(self, prompt: Sequence[int]) -> int:
        """How many prompt tokens :meth:`prefill` will evaluate."""
        reuse = common_prefix(self.tokens, prompt)
        if reuse == len(prompt):
            if reuse == len(self.tokens) and self._logits is not None:
                return 0
            reuse -= 1  # the last prompt token is evaluated again for its logits
        return len(prompt) - reuse

    def prefill(self, prompt: Sequence[int]) -> np.ndarray:
        if not prompt:
            raise ValueError("an empty prompt has nothing to continue")
        if len(prompt) > self._runtime.context_tokens:
            raise ValueError(f"a prompt of {len(prompt)} tokens exceeds the context of {self._runtime.context_tokens}")
        keep = len(prompt) - self.pending(prompt)
        if keep == len(prompt):
            assert self._logits is not None
            return self._logits
        self._truncate(keep)
        for start in range(keep, len(prompt), PREFILL_CHUNK):
            self.extend(prompt[start : start + PREFILL_CHUNK])
        assert self._logits is not None
        return self._logits

    def extend(self, ids: Sequence[int]) -> np.ndarray:
        if len(self.tokens) + len(ids) > self._runtime.context_tokens:
            raise ValueError(f"the context of {self._runtime.context_tokens} tokens is full")
        self._logits, self._past = self._runtime.run(ids, self._past)
        self.tokens.extend(ids)
        self.evaluated += len(ids)
        return self._logits

    def generate(self, prompt: Sequence[int], pick: Callable[[np.ndarray, list[int]], int]) -> Iterator[int]:
        """Tokens one by one; each is evaluated only when the next one is asked for, so the cache
        never holds a token the caller did not take (such as the stop token)."""
        logits = self.prefill(prompt)
        while True:
            token = pick(logits, self.tokens)
            yield token
            logits = self.extend([token])

    def release(self) -> None:
        self.tokens = []
        self._past = []
        self._logits = None

    def _truncate(self, length: int) -> None:
        if length < len(self.tokens):
            self.tokens = self.tokens[:length]
            self._past = [np.ascontiguousarray(a[:, :, :length]) for a in self._past]
            self._logits = None
