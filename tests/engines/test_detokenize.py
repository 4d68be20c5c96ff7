"""The thinker's text deltas (``TextDeltas``): decoding a window of the last tokens gives, token by
token, exactly the text of a whole decode, with tokenizers trained here at test time: byte-level
BPE (characters split over several tokens) and a sentencepiece-style one (a word's leading space
written by its decoder), and with the byte tokenizer of the tiny test checkpoints."""

from __future__ import annotations

import pytest

from realtime_omni.engines.omni.detokenize import TextDeltas

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

TEXT = "Bonjour 你好 🎉 how are you today, très bien! Émoji 🚀🚀 done. 今天天气很好。"
CORPUS = [TEXT, "Hello, how can I help you today?", "ça va très bien, merci", "你好世界 🎉"] * 10


def _fast(model, pre_tokenizer, decoder):
    from tokenizers import trainers

    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet() if isinstance(
        pre_tokenizer, tokenizers.pre_tokenizers.ByteLevel) else []
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_end|>"],
                                                       initial_alphabet=alphabet))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok)


def byte_level():
    pre = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    return _fast(tokenizers.models.BPE(), pre, tokenizers.decoders.ByteLevel())


def metaspace():
    pre = tokenizers.pre_tokenizers.Metaspace()
    return _fast(tokenizers.models.BPE(unk_token="<|im_end|>"), pre, tokenizers.decoders.Metaspace())


def streamed(tokenizer, ids, skip_special_tokens=True) -> list[str]:
    deltas = TextDeltas(tokenizer, skip_special_tokens=skip_special_tokens)
    return [deltas.delta(ids[: i + 1]) for i in range(len(ids))]


@pytest.mark.parametrize("make", [byte_level, metaspace])
def test_the_deltas_add_up_to_the_whole_decode_and_never_show_half_a_character(make):
    tok = make()
    ids = tok.encode(TEXT * 3, add_special_tokens=False)
    pieces = streamed(tok, ids)
    assert "".join(pieces) == tok.decode(ids)
    assert not any("\ufffd" in p for p in pieces)
    if make is byte_level:
        assert "" in pieces  # some characters did take several tokens (else this proves little)
    # each token's text shows as soon as it is whole: the text after k tokens is the decode of them
    shown = ""
    for k, piece in enumerate(pieces, start=1):
        shown += piece
        whole = tok.decode(ids[:k])
        assert whole.startswith(shown) and (shown == whole or whole.endswith("\ufffd"))


def test_special_tokens_are_skipped_or_kept_as_asked():
    tok = byte_level()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("how are you", add_special_tokens=False) + [end] + tok.encode(" done", add_special_tokens=False)
    assert "".join(streamed(tok, ids)) == tok.decode(ids, skip_special_tokens=True) == "how are you done"
    kept = "".join(streamed(tok, ids, skip_special_tokens=False))
    assert kept == tok.decode(ids, skip_special_tokens=False) and "<|im_end|>" in kept


def test_the_test_checkpoints_byte_tokenizer_streams_multibyte_characters_whole():
    from realtime_omni.engines.omni.assets import ByteTokenizer

    from .test_omni import qwen3_config

    tok = ByteTokenizer(qwen3_config())
    ids = tok.encode(TEXT)
    pieces = streamed(tok, ids)
    assert "".join(pieces) == TEXT and not any("\ufffd" in p for p in pieces)
    assert pieces[ids.index(0xE4)] == ""  # the first byte of 你 shows nothing yet


def test_a_sequence_cut_back_below_what_was_shown_is_refused():
    tok = byte_level()
    ids = tok.encode("how are you", add_special_tokens=False)
    deltas = TextDeltas(tok)
    for i in range(len(ids)):
        deltas.delta(ids[: i + 1])
    with pytest.raises(ValueError, match="cut back"):
        deltas.delta(ids[:1])


def test_each_step_decodes_a_few_tokens_not_the_whole_reply():
    tok = byte_level()
    windows: list[int] = []

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            windows.append(len(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tok.encode(TEXT * 10, add_special_tokens=False)
    assert "".join(streamed(Counting(), ids)) == tok.decode(ids)
    assert len(ids) > 200 and max(windows) <= 8  # (the longest: a 4-byte emoji with its context)
