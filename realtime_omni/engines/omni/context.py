"""What a session keeps of the thinker's context, and what flows from the thinker to the talker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .detokenize import TextDeltas
from .device_copy import to_device
from .graphs import StaticDecoder


class _Rows:
    """A growable (capacity-doubling) row buffer on the model's device: append and crop in O(new)."""

    def __init__(self) -> None:
        self.data = None
        self.n = 0

    def append(self, rows) -> None:
        import torch

        k = rows.shape[0]
        if self.data is None:
            self.data = torch.empty((max(64, 2 * k), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        self._room(k)
        self.data[self.n : self.n + k] = rows
        self.n += k

    def skip(self, k: int) -> None:
        """``k`` rows written later (room is made now; what they hold until then is undefined)."""
        if self.data is None:
            raise ValueError("rows can be skipped only after a first append (their shape and device)")
        self._room(k)
        self.n += k

    def _room(self, k: int) -> None:
        if self.n + k > self.data.shape[0]:
            import torch

            grown = torch.empty((max(2 * self.data.shape[0], self.n + k), *self.data.shape[1:]),
                                dtype=self.data.dtype, device=self.data.device)
            grown[: self.n] = self.data[: self.n]
            self.data = grown

    def crop(self, n: int) -> None:
        self.n = min(self.n, max(0, n))

    def view(self, start: int = 0, end: int | None = None):
        end = self.n if end is None else min(end, self.n)
        return self.data[start:end]

    def clear(self) -> None:
        self.data = None
        self.n = 0


class _HostPositions:
    """Rotary positions ``(T, 3)`` on the host, growable like :class:`_Rows`: stored in numpy, so a
    generated token's positions are written without a tensor op; read as zero-copy torch views."""

    def __init__(self) -> None:
        self.data = np.zeros((64, 3), dtype=np.int64)
        self.n = 0

    def _room(self, k: int) -> None:
        if self.n + k > len(self.data):
            grown = np.zeros((max(2 * len(self.data), self.n + k), 3), dtype=np.int64)
            grown[: self.n] = self.data[: self.n]
            self.data = grown

    def append(self, rows) -> None:
        """``rows``: a ``(k, 3)`` tensor."""
        k = rows.shape[0]
        self._room(k)
        self.data[self.n : self.n + k] = rows.detach().cpu().numpy()
        self.n += k

    def append_same(self, pos: int) -> None:
        """One text token: the same position on all three rotary axes."""
        self._room(1)
        self.data[self.n] = pos
        self.n += 1

    def crop(self, n: int) -> None:
        self.n = min(self.n, max(0, n))

    def view(self, start: int = 0, end: int | None = None):
        import torch

        end = self.n if end is None else min(end, self.n)
        return torch.from_numpy(self.data[start:end])

    def clear(self) -> None:
        self.n = 0


@dataclass
class MessageRecord:
    """One message of the conversation as it lies in the cache."""

    fingerprint: tuple
    start: int
    end: int
    #: False for a generated reply whose closing ``<|im_end|>\n`` is not in the cache yet
    closed: bool = True
    #: the reply being generated into this record: its text is the fingerprint until one is set
    #: (:meth:`settle`), made when a turn compares its messages, not again at every token
    live: ReplyState | None = field(default=None, repr=False, compare=False)

    def current(self) -> tuple:
        """The fingerprint as the record stands now (a live reply's text so far)."""
        if self.live is None:
            return self.fingerprint
        from .prompt import norm_text

        return ("assistant", norm_text(self.live.text))

    def settle(self, fingerprint: tuple) -> None:
        self.fingerprint, self.live = fingerprint, None


@dataclass
class ReplyState:
    """The reply being (or last) generated: what confirm() needs to cut it back."""

    turn: int
    record: MessageRecord
    content_start: int  # cache index of the first generated token
    ids: list[int] = field(default_factory=list)  # emitted tokens (forwarded or not)
    text: str = ""  # concatenation of the emitted text deltas
    ends: list[int] = field(default_factory=list)  # len(text) after each token's delta
    forwarded: int = 0  # how many of ``ids`` are in the cache
    #: where the decoded text of ``ids`` stands (made by the thinker at the first token)
    deltas: TextDeltas | None = None


@dataclass
class MultimodalItem:
    """An audio clip or an image inside the cache (the Qwen3 talker recomputes rope positions)."""

    pos: int  # cache index of its start token (<|audio_start|> / <|vision_start|>)
    kind: str  # "audio" | "image"
    value: Any  # audio: feature length (int); image: grid_thw (3 ints)


class ThinkerContext:
    """The thinker's kept context for one session."""

    def __init__(self) -> None:
        self.decoder: StaticDecoder | None = None  # the KV cache and its captured decode step
        self.ids: list[int] = []
        self.positions = _HostPositions()  # (T, 3) rotary positions
        self.src = _Rows()  # (T, D) talker source vectors
        #: (row, token id) of generated tokens whose source vector is their embedding (Qwen3's
        #: batched thinker): made when the context's vectors are read, all at once
        self.embed_later: list[tuple[int, int]] = []
        self.mm: list[bool] = []
        self.next_pos = 0
        self.messages: list[MessageRecord] = []
        self.items: list[MultimodalItem] = []
        self.reply: ReplyState | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def append_token(self, token: int, pos: int, src, tokens: Any) -> None:
        """One forwarded text token at rotary position ``pos``, with its talker vector ``src`` (D,);
        None: the token's embedding, made when the vectors are read (:meth:`source_rows`)."""
        self.ids.append(token)
        self.mm.append(token in (tokens.audio, tokens.image))
        self.positions.append_same(pos)
        if src is None:
            self.embed_later.append((self.src.n, token))
            self.src.skip(1)
        else:
            self.src.append(src[None])
        self.next_pos = pos + 1

    def source_rows(self, embed: Any, n: int) -> Any:
        """The first ``n`` talker source vectors, those left for later embedded now with ``embed``
        (the thinker's input embeddings) in one call."""
        if self.embed_later:
            import torch

            rows, ids = zip(*self.embed_later, strict=True)
            self.embed_later.clear()
            data = self.src.data
            with torch.inference_mode():
                vectors = embed(to_device(torch.tensor(ids, dtype=torch.long), data.device)).to(data.dtype)
                data.index_copy_(0, to_device(torch.tensor(rows, dtype=torch.long), data.device), vectors)
        return self.src.view(0, n)

    def crop(self, n: int) -> None:
        """Cut every per-token store (and the KV cache) back to the first ``n`` tokens."""
        n = max(0, min(n, len(self.ids)))
        if self.decoder is not None:
            self.decoder.crop(n)
        del self.ids[n:]
        del self.mm[n:]
        self.positions.crop(n)
        self.src.crop(n)
        self.embed_later = [(row, token) for row, token in self.embed_later if row < n]
        self.items = [it for it in self.items if it.pos < n]
        self.messages = [m for m in self.messages if m.start < n]
        if self.messages and self.messages[-1].end > n:
            self.messages[-1].end = n
        self.next_pos = int(self.positions.view().max()) + 1 if n else 0

    def free(self) -> None:
        if self.decoder is not None:
            self.decoder.release()
        self.decoder = None
        self.ids.clear()
        self.mm.clear()
        self.positions.clear()
        self.src.clear()
        self.embed_later.clear()
        self.messages.clear()
        self.items.clear()
        self.reply = None
        self.next_pos = 0


# ---------------------------------------------------------------------------------------------
# what flows to the talker


@dataclass
class TalkerPrompt:
    """Snapshot of the context the talker is prefilled with (taken when the reply starts)."""

    turn: int
    # Qwen2.5: every context token (the talker sees the whole thinker input)
    src: Any = None  # (T, D)
    positions: Any = None  # (T, 3)
    next_pos: int = 0
    # Qwen3: user-turn tokens only, plus the assistant header of this reply
    user_ids: list[int] = field(default_factory=list)
    user_src: Any = None  # (U, D)
    user_mm: Any = None  # (U,) bool
    user_items: list[MultimodalItem] = field(default_factory=list)
    header_ids: list[int] = field(default_factory=list)
    header_src: Any = None  # (h, D) token embeddings of "<|im_start|>assistant\n"


class TokenRows:
    """What a reply's thinker hands its talker on the device: the talker prompt (at the reply's
    first output) and per reply token its rows (Qwen2.5: the hidden vector; Qwen3's talker needs
    only the token ids, which the output carries). They pass here, inside the process that holds the
    model: the ``ThinkerOutput`` between thinker and talker may cross a process boundary (the
    worker's pipe pickles it), and device tensors must not ride on it. A new turn drops the last."""

    def __init__(self) -> None:
        self._turn = -1
        self._prompt: TalkerPrompt | None = None
        self._rows: dict[int, Any] = {}

    def _at(self, turn: int) -> bool:
        """Move to ``turn``; False for an older turn (a superseded reply's thread, late: it must
        not wipe what the newer reply already put)."""
        if turn < self._turn:
            return False
        if turn != self._turn:
            self._turn, self._prompt, self._rows = turn, None, {}
        return True

    def put_prompt(self, turn: int, prompt: TalkerPrompt) -> None:
        if self._at(turn):
            self._prompt = prompt

    def prompt(self, turn: int) -> TalkerPrompt | None:
        return self._prompt if turn == self._turn else None

    def put(self, turn: int, index: int, rows: Any) -> None:
        if self._at(turn):
            self._rows[index] = rows

    def take(self, turn: int, index: int) -> Any:
        return self._rows.pop(index, None) if turn == self._turn else None


@dataclass
class TokenHidden:
    """``ThinkerOutput.hidden`` of the omni engine."""

    turn: int
    index: int  # index of the token within the reply (-1 for an end marker without token)
    token_id: int
    #: the talker prompt, on the first output of each reply; it travels in the session's
    #: :class:`TokenRows` (``opens`` marks that output) and the talker puts it back here
    prompt: TalkerPrompt | None = None
    opens: bool = False
    end: bool = False  # end of the reply (EOS, max tokens)
    eos: bool = False  # the token is the thinker's EOS (never forwarded)


def talker_prompt(ctx: ThinkerContext, loaded: Any, turn: int, reply: bool = True) -> TalkerPrompt:
    """What the talker is prefilled with for the reply that starts now, from the thinker's
    context (``reply`` False: the context alone, before a reply's header is in the cache)."""
    import torch

    n = len(ctx)
    if loaded.arch == "qwen2_5_omni":
        return TalkerPrompt(turn=turn, src=ctx.src.view(0, n).clone(),
                            positions=ctx.positions.view(0, n).clone(), next_pos=ctx.next_pos)
    tok = loaded.tokens
    ids = ctx.ids
    # role of every token = the token after the last <|im_start|> at or before it
    user, role = [], None
    for i, t in enumerate(ids):
        if t == tok.im_start and i + 1 < n:
            role = ids[i + 1]
        user.append(role == tok.user_token_id)
    start = n if not reply else next(
        (i - 1 for i in range(n - 1, 0, -1) if ids[i - 1] == tok.im_start and ids[i] == tok.assistant_token_id),
        ctx.reply.record.start)
    idx = torch.tensor([i for i in range(n) if user[i]], dtype=torch.long)
    src = ctx.source_rows(loaded.thinker.get_input_embeddings(), n)
    user_items = [it for it in ctx.items if it.pos < n and user[it.pos]]
    return TalkerPrompt(
        turn=turn,
        user_ids=[ids[i] for i in idx.tolist()],
        user_src=src.index_select(0, to_device(idx, src.device)).clone() if idx.numel() else src[:0].clone(),
        user_mm=torch.tensor([ctx.mm[i] for i in idx.tolist()], dtype=torch.bool),
        user_items=[MultimodalItem(int(sum(user[: it.pos])), it.kind, it.value) for it in user_items],
        header_ids=ids[start:n],
        header_src=src[start:n].clone(),
    )
