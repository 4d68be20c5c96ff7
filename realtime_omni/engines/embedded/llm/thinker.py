"""SmolLM2-135M-Instruct (GGUF) on ONNX Runtime as the cascade thinker.

The weights are loaded once (:class:`DecoderRuntime`); every session owns a
:class:`ContextCache` (its keys/values). The prompt is rendered to tokens here, message by message,
so the token prefix is stable from turn to turn and each response only evaluates what changed
since the previous one (usually just the new user turn).
"""

from __future__ import annotations

import codecs
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import numpy as np

from ...base import ThinkerOutput, ThinkRequest, TurnMessage
from ...tool_calls import NAME_END, AllowedTokens, CallParser, call_grammar, compile_call_grammar
from ..tool_calls import CALL_PREFIX, MARKER, render_call, tools_prompt
from .model_file import locate_model_file
from .runtime import ContextCache, DecoderRuntime
from .sampling import Sampling, sample

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful voice assistant. Your replies are spoken aloud, so answer in one or two "
    "short spoken sentences, in plain words, without lists, markdown or emojis."
)
DEFAULT_MAX_OUTPUT_TOKENS = 200
SAMPLING = Sampling(temperature=0.3, top_p=0.9, top_k=40, min_p=0.05, repeat_penalty=1.2)
#: a call's arguments repeat quotes and braces by nature: no repeat penalty there
CALL_SAMPLING = Sampling(temperature=0.3, top_p=0.9, top_k=40, min_p=0.05, repeat_penalty=1.0)
#: the least context left for the conversation after instructions and tool declarations
_MIN_TURN_ROOM = 128
_REPLY_CACHE = 8  # recent replies whose generated tokens are reused when they come back as history
#: room kept for the user's next message when judging whether the next turn will still fit
_NEXT_MESSAGE_ROOM = 96
#: tokens evaluated at a time ahead of the next turn (about 80 ms on 2 cores): the next reply waits no longer
_AHEAD_STEP = 64


class LlamaThinkerModel:
    """Shared part: the decoder runtime, special token ids and a thread that warms new caches."""

    def __init__(
        self,
        model_path: str | Path | None = None,
        n_ctx: int = 2048,
        n_threads: int = 2,
        cache_dir: Path | None = None,
        seed: int | None = None,
    ) -> None:
        self._configured_path = Path(model_path) if model_path is not None else None
        self.model_path: Path  # found (or fetched) by load()
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.cache_dir = cache_dir
        #: seeds the sampling of every session opened from here on, in order (None: fresh seeds)
        self._seeds = np.random.SeedSequence(seed) if seed is not None else None
        # new sessions' caches are warmed (default system prompt evaluated) here, off the caller's
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-warm")
        # filled by load()
        self.runtime: DecoderRuntime
        self.im_start: list[int] = []
        self.im_end: list[int] = []
        self.newline: list[int] = []
        self.stop_tokens: frozenset[int] = frozenset()
        self._system_prefix: list[int] = []

    def load(self, progress=lambda _m: None) -> None:
        """Find (or fetch) the model file, build (or read back) its graph, find the chat format's tokens."""
        self.model_path = locate_model_file(self._configured_path, self.cache_dir, progress)
        self.runtime = DecoderRuntime(self.model_path, self.n_threads, self.n_ctx, self.cache_dir, progress)
        tokenizer = self.runtime.tokenizer
        self.im_start = [tokenizer.special("<|im_start|>")]
        self.im_end = [tokenizer.special("<|im_end|>")]
        self.newline = tokenizer.encode("\n")
        # <|im_start|> as output means the model is starting a new turn on its own
        self.stop_tokens = frozenset({self.im_end[0], self.im_start[0], tokenizer.special("<|endoftext|>")})
        self._system_prefix = self.render_header("system") + self.text_tokens(DEFAULT_SYSTEM_PROMPT)
        ContextCache(self.runtime).prefill(self._system_prefix)  # the first run pays ORT's one-off costs

    def _new_warm_cache(self) -> ContextCache:
        cache = ContextCache(self.runtime)
        # The default system prompt starts every conversation: evaluate it before the first turn.
        cache.prefill(self._system_prefix)
        return cache

    def open(self) -> LlamaThinker:
        return LlamaThinker(self, self._loader.submit(self._new_warm_cache))

    def close(self) -> None:
        self._loader.shutdown(wait=True, cancel_futures=True)

    # -- prompt rendering (ChatML, as SmolLM2's chat template) --------------------------------

    def render_header(self, role: str) -> list[int]:
        return self.im_start + self.runtime.tokenizer.encode(f"{role}\n")

    def text_tokens(self, text: str) -> list[int]:
        # plain text: user text that spells "<|im_end|>" must not become a control token
        return self.runtime.tokenizer.encode(text)

    def token_bytes(self, token: int) -> bytes:
        return self.runtime.tokenizer.token_bytes[token]


class LlamaThinker:
    """Per-session thinker: one context cache, reused across turns."""

    def __init__(self, shared: LlamaThinkerModel, instance: Future[ContextCache]) -> None:
        self._shared = shared
        self._instance = instance
        # Guards the cache across threads. Taken per generated token, not per response, so an
        # abandoned (never closed) think() generator can't block the next response or close().
        # Reentrant: a generator finalised by the GC on this thread re-takes it in its finally.
        self._lock = threading.RLock()
        self._closed = False
        self._generation = 0
        self._rng = np.random.default_rng(shared._seeds.spawn(1)[0] if shared._seeds is not None else None)
        # reply text (stripped) -> the tokens generated for it: re-tokenizing generated text can
        # give a different (equally valid) token split, which would break prefix reuse
        self._replies: OrderedDict[str, list[int]] = OrderedDict()
        self._last_reply: tuple[str, list[int]] | None = None
        # full reply text (stripped) -> what was actually heard of it (see confirm)
        self._truncated: dict[str, str] = {}
        # index of the first conversation message still in the prompt (see _window)
        self._first_turn = 0
        #: the conversation moved forward after a reply, on the loader thread (see _move_window_ahead)
        self.window_ahead: Future[int] | None = None

    # -- public ------------------------------------------------------------------------------

    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        if self._closed:
            raise RuntimeError("thinker is closed")
        cache = self._wait_for_instance(request.cancelled)
        if cache is None:
            return  # cancelled (or closed) before this session's cache was ready
        mode = request.tool_choice if request.tools else "none"
        with self._lock:
            if self._closed:
                raise RuntimeError("thinker is closed")
            self._generation += 1
            generation = self._generation
            prompt = self._render(request, with_tools=mode != "none")
            budget = request.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS
            budget = max(1, min(budget, self._shared.n_ctx - len(prompt)))
            counts: dict[str, int] = {"prefilled_tokens": cache.pending(prompt), "prompt_tokens": len(prompt)}
        if mode == "required":
            yield from self._call(cache, generation, prompt, request, budget, counts)
            return
        used = yield from self._reply(cache, generation, prompt, request, budget, counts, watch=mode == "auto")
        if used is not None:  # the reply began a function call
            yield from self._call(cache, generation, prompt, request, budget - used, counts)

    def _reply(self, cache: ContextCache, generation: int, prompt: list[int], request: ThinkRequest, budget: int,
               counts: dict[str, int], watch: bool) -> Iterator[ThinkerOutput]:
        """Free text. With ``watch``, a reply that opens with the call marker stops here and
        returns the tokens it used (the caller continues with the constrained call); else None."""
        tokens_iter = cache.generate(prompt, lambda logits, recent: sample(logits, recent, SAMPLING, self._rng))
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
                    piece = decoder.decode(self._shared.token_bytes(token))
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
                    if not self._closed:
                        self.window_ahead = self._shared._loader.submit(
                            self._move_window_ahead, request, text, generation)
        return None

    def _call(self, cache: ContextCache, generation: int, prompt: list[int], request: ThinkRequest, budget: int,
              counts: dict[str, int]) -> Iterator[ThinkerOutput]:
        """A function call: the server writes the opening, the grammar holds the model to a
        declared name and to arguments that fit its schema."""
        named = request.tool_name
        tools = [t for t in request.tools if t.name == named] if named else request.tools
        parser = CallParser([t.name for t in tools])
        forced = CALL_PREFIX + (named + NAME_END if named else "")
        matcher = compile_call_grammar(call_grammar(tools, named=named is not None),
                                       self._shared.runtime.guidance_tokenizer())
        allowed_tokens = AllowedTokens(matcher, self._shared.runtime.tokenizer.vocab_size)

        def pick(logits: np.ndarray, recent: list[int]) -> int:
            token = sample(logits, recent, CALL_SAMPLING, self._rng, allowed_tokens())
            matcher.consume_token(token)
            return token

        tokens_iter = cache.generate(prompt + self._shared.text_tokens(forced), pick)
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
                    piece = "" if finished else decoder.decode(self._shared.token_bytes(token))  # type: ignore[arg-type]
                generated += 1
                pieces = [parser.finish()] if finished else parser.feed(piece)
        finally:
            with self._lock:
                tokens_iter.close()

    def confirm(self, spoken_text: str) -> None:
        """Only ``spoken_text`` of the last reply was heard: the next prompt renders just that.

        The heard part keeps the tokens that were generated for it (where they decode to a
        prefix of it), so the cache stays valid up to the cut and only the rest is prefilled.
        """
        with self._lock:
            if self._last_reply is None or self._closed:
                return
            full_text, tokens = self._last_reply
            if spoken_text.strip() == full_text.strip():
                return
            heard = spoken_text.lstrip()
            keep: list[int] = []
            decoded = b""
            for token in tokens:
                candidate = decoded + self._shared.token_bytes(token)
                if not heard.encode().startswith(candidate.lstrip()):
                    break
                keep.append(token)
                decoded = candidate
            while keep and not _is_utf8(decoded):  # don't cut inside a multi-byte character
                decoded = decoded[: len(decoded) - len(self._shared.token_bytes(keep.pop()))]
            rest = heard[len(decoded.lstrip().decode()) :]
            self._remember_tokens(heard, keep + self._shared.text_tokens(rest))
            self._truncated[full_text.strip()] = heard
            while len(self._truncated) > _REPLY_CACHE:
                del self._truncated[next(iter(self._truncated))]
            self._last_reply = (heard, self._replies[heard.strip()])

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._replies.clear()
        if not self._instance.cancel():
            # warm or warming: free it as soon as it exists (immediately if it already does)
            self._instance.add_done_callback(_release)

    # -- internals ---------------------------------------------------------------------------

    def _wait_for_instance(self, cancelled: threading.Event) -> ContextCache | None:
        """Wait for the background-warmed cache without pinning a worker thread after a
        cancel: an abandoned response must not hold a model thread while caches warm."""
        while True:
            try:
                return self._instance.result(timeout=0.05)
            except FutureTimeout:
                if cancelled.is_set() or self._closed:
                    return None
            except FutureCancelled:
                return None

    def _move_window_ahead(self, request: ThinkRequest, reply: str, generation: int) -> int:
        """After a reply: if the next turn would no longer fit, drop the oldest turns now and
        evaluate what is left, while the reply plays, rather than when the user's next turn
        arrives (a whole conversation takes one to three seconds on 2 cores). It goes a few
        tokens at a time and gives way to the next reply, which starts from what was evaluated.
        Returns the tokens evaluated (0: the next turn still fits, or the session moved on)."""
        with self._lock:
            if self._closed or generation != self._generation or not self._instance.done():
                return 0
            before = self._first_turn
            ahead = dataclasses.replace(request, messages=[*request.messages, TurnMessage("assistant", reply)])
            try:
                prompt = self._render(ahead, with_tools=bool(request.tools) and request.tool_choice != "none",
                                      reserve=_NEXT_MESSAGE_ROOM)
            except ValueError:  # instructions that leave no room: the next turn says so itself
                return 0
            if self._first_turn == before:
                return 0
        conversation = prompt[: len(prompt) - len(self._shared.render_header("assistant"))]
        cache = self._instance.result()
        evaluated = 0
        while True:
            with self._lock:
                pending = cache.pending(conversation)
                if self._closed or generation != self._generation or pending == 0:
                    return evaluated
                start = len(conversation) - pending
                end = min(len(conversation), start + _AHEAD_STEP)
                cache.prefill(conversation[:end])
                evaluated += end - start

    def _render(self, request: ThinkRequest, with_tools: bool = False, reserve: int = 0) -> list[int]:
        shared = self._shared
        system = shared.render_header("system")
        system += shared.text_tokens(DEFAULT_SYSTEM_PROMPT)
        if request.instructions.strip():
            system += shared.text_tokens("\n\n" + request.instructions.strip())
        if with_tools:
            system += shared.text_tokens("\n\n" + tools_prompt(request.tools))
        system += shared.im_end + shared.newline
        tail = shared.render_header("assistant")
        # keep room for the reply
        room = shared.n_ctx - min(request.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS, 512) - reserve
        if len(system) + len(tail) + _MIN_TURN_ROOM > room:
            raise ValueError(f"instructions and tools take {len(system)} tokens; this model's context holds "
                             f"{shared.n_ctx}, with room kept for the reply and the conversation")
        turns = [self._render_message(m) for m in request.messages]
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
        start = min(self._first_turn, last)
        # back to the whole conversation only with room to spare once turns were dropped (it
        # shrank): else a turn dropped ahead of time (_move_window_ahead) would come back
        if fixed + suffix[0] <= room - (_NEXT_MESSAGE_ROOM if start else 0):
            start = 0
        elif fixed + suffix[start] > room:
            target = fixed + (room - fixed) // 2
            while start < last and fixed + suffix[start] > target:
                start += 1
        self._first_turn = start
        return turns[start:]

    def _render_message(self, message: TurnMessage) -> list[int]:
        shared = self._shared
        text = message.text.strip()
        content: list[int] | None = None
        if message.call is not None:
            text = render_call(message.call)
        elif message.role == "assistant":
            text = self._truncated.get(text, text)
            content = self._replies.get(text.strip())
        if content is None:
            content = shared.text_tokens(text)
        return shared.render_header(message.role) + content + shared.im_end + shared.newline

    def _remember(self, text: str, tokens: list[int]) -> None:
        self._remember_tokens(text, tokens)
        self._last_reply = (text, tokens)

    def _remember_tokens(self, text: str, tokens: list[int]) -> None:
        key = text.strip()
        self._replies[key] = list(tokens)
        self._replies.move_to_end(key)
        while len(self._replies) > _REPLY_CACHE:
            self._replies.popitem(last=False)


def _release(future: Future[ContextCache]) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().release()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True
