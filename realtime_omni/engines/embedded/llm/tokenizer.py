"""SmolLM2's byte-level BPE tokenizer, rebuilt from the GGUF file's own tables (vocabulary,
token types, merges).

The HF ``tokenizers`` library does the encoding (the vocabulary, merges and control tokens come
from the file, so no tokenizer download is needed); this module adds what streaming needs: each
token's raw bytes, so a reply can be decoded incrementally without splitting a UTF-8 character.
"""

from __future__ import annotations

from functools import cache

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

CONTROL = 3  # GGUF token type of control tokens (<|im_start|>, <|endoftext|>, …)


@cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, inverted (byte-level BPE spells bytes this way)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _bpe(tokens: list[str], merge_lines: list[str]) -> Tokenizer:
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in merge_lines]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # SmolLM2's pre-tokenizer: every digit apart, then GPT-2's split, bytes as printable chars
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class BpeTokenizer:
    def __init__(self, tokens: list[str], types: list[int], merges: list[str]) -> None:
        # two instances: user text is encoded without control-token matching (a user who types
        # "<|im_end|>" gets those characters); the other one, with control tokens, is the
        # complete tokenizer that the grammar engine reads
        self._plain = _bpe(tokens, merges)
        self.tokenizer = _bpe(tokens, merges)
        self.tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                           for i, kind in enumerate(types) if kind == CONTROL])
        self.vocab_size = len(tokens)
        self._special = {tokens[i]: i for i, kind in enumerate(types) if kind == CONTROL}
        byte_of = _byte_of_char()
        self.token_bytes: list[bytes] = [
            token.encode() if types[i] == CONTROL else bytes(byte_of.get(c, 0x3F) for c in token)
            for i, token in enumerate(tokens)
        ]

    def special(self, text: str) -> int:
        """The id of a control token such as ``<|im_start|>``."""
        try:
            return self._special[text]
        except KeyError:
            raise ValueError(f"{text!r} is not a control token of this vocabulary") from None

    def encode(self, text: str) -> list[int]:
        return self._plain.encode(text, add_special_tokens=False).ids if text else []

    def decode_bytes(self, ids: list[int]) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids)

    def to_json(self) -> str:
        return self.tokenizer.to_str()
