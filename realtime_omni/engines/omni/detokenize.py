"""Text deltas of a growing token sequence, decoding only its last few tokens at each step.

Decoding the whole reply again for each new token costs time in proportion to the reply's length,
in every session's thread, under the interpreter lock all sessions share: a reply of n tokens
pays for n²/2 token decodes. Here each step decodes a short window twice: the tokens since the
last text shown, with and without the few before them. The window's start is a token boundary
where text was already shown, so a byte-level tokenizer's characters split over several tokens,
and a tokenizer that writes a word's leading space from its neighbour, read the same as in a
whole decode; the difference between the two decodes is the new text. A window whose decode
ends in an incomplete character (U+FFFD) shows nothing yet and grows with the next token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TextDeltas:
    """Where a sequence's decoded text stands: ``delta(ids)`` returns the text the tokens
    appended since the last call add (empty while a character is incomplete)."""

    __slots__ = ("_shown", "_start", "_start_text", "skip_special_tokens", "tokenizer")

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._start = 0  # the window's first token: context for the tokens after ``_shown``
        self._shown = 0  # tokens whose text has been returned
        self._start_text: str | None = ""  # decode of ids[_start:_shown] (None: not yet made)

    def delta(self, ids: Sequence[int]) -> str:
        if len(ids) < self._shown:
            raise ValueError("the sequence was cut back; start a new TextDeltas")
        if self._start_text is None:
            self._start_text = self._decode(ids[self._start : self._shown])
        text = self._decode(ids[self._start :])
        if len(text) <= len(self._start_text) or text.endswith("\ufffd"):
            return ""
        new = text[len(self._start_text) :]
        self._start, self._shown, self._start_text = self._shown, len(ids), None
        return new

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)
