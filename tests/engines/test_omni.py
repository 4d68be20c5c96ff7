"""The omni engine on tiny random Qwen2.5-Omni and Qwen3-Omni checkpoints.

Each checkpoint is built here from a tiny config that keeps the real layout (same sub-configs,
special-token structure, 24 kHz codecs), saved with ``save_pretrained`` plus a byte-level
tokenizer, and loaded back through ``OmniModel(path).load()`` — the path a real checkpoint takes.
Everything is greedy so the streaming engine can be compared with the reference one-shot
``generate``.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from realtime_omni.engines.base import ThinkRequest, TurnMessage  # noqa: E402
from realtime_omni.engines.omni import OmniModel  # noqa: E402
from realtime_omni.engines.omni.codec_stream import CodecStream  # noqa: E402
from realtime_omni.engines.omni.audio_features import log_mel  # noqa: E402
from realtime_omni.engines.omni.codec import CodecSettings, OmniCodec  # noqa: E402
from realtime_omni.engines.omni.talker import CodeChunk  # noqa: E402
from realtime_omni.engines.settings import OmniSettings  # noqa: E402

# ---------------------------------------------------------------------------------------------
# tiny checkpoints

SPECIAL = {
    "<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258, "<|audio_bos|>": 259,
    "<|audio_eos|>": 260, "<|AUDIO|>": 261, "<|vision_bos|>": 262, "<|vision_eos|>": 263,
    "<|IMAGE|>": 264, "<|VIDEO|>": 265, "<|vision_pad|>": 266, "<|tts_bos|>": 270, "<|tts_eos|>": 271,
    "<|tts_pad|>": 272, "<|spk_chelsie|>": 273, "<|spk_ethan|>": 274,
}
WORDS = {"system": 267, "user": 268, "assistant": 269}
#: the Qwen call tags: plain added tokens (not special), as in the released vocabularies
TOOL_TAGS = {"<tool_call>": 275, "</tool_call>": 276}
VOCAB = 288
S = {k.strip("<|>").lower(): v for k, v in SPECIAL.items()}


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def make_tokenizer():
    """Byte-level BPE without merges: bytes are ids 0..255, chat tokens follow at fixed ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    entries = sorted([(i, s, True) for s, i in SPECIAL.items()]
                     + [(i, w, False) for w, i in {**WORDS, **TOOL_TAGS}.items()])
    for i, text, special in entries:
        while tok.get_vocab_size() < i:  # unused ids stay reserved
            tok.add_tokens([AddedToken(f"<|reserved_{tok.get_vocab_size()}|>", special=True)])
        token = AddedToken(text, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
        assert tok.token_to_id(text) == i
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def _text(rope_section, **extra):
    return dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                rope_theta=1e6, tie_word_embeddings=False,
                rope_scaling={"mrope_section": rope_section, "rope_type": "default", "type": "default"}, **extra)


def qwen25_config():
    ids = dict(audio_token_index=S["audio"], image_token_index=S["image"], video_token_index=S["video"],
               audio_start_token_id=S["audio_bos"], audio_end_token_id=S["audio_eos"],
               vision_start_token_id=S["vision_bos"], vision_end_token_id=S["vision_eos"])
    thinker = dict(
        audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
                          num_mel_bins=32, output_dim=32, n_window=100, max_source_positions=1500),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, intermediate_size=32, num_heads=2,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32,
                           window_size=112, fullatt_block_indexes=[0]),
        text_config=_text([1, 1, 2]), vision_token_id=S["vision_pad"], user_token_id=WORDS["user"],
        bos_token_id=S["im_start"], eos_token_id=S["im_end"], pad_token_id=S["endoftext"],
        position_id_per_seconds=25, seconds_per_chunk=2, **ids)
    talker = dict(
        vocab_size=64, tts_codec_pad_token_id=60, tts_codec_start_token_id=61, tts_codec_end_token_id=62,
        tts_codec_mask_token_id=63, tts_text_start_token_id=S["tts_bos"], tts_text_end_token_id=S["tts_eos"],
        tts_text_pad_token_id=S["tts_pad"], embedding_size=32, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        rope_scaling={"mrope_section": [2, 3, 3], "rope_type": "default", "type": "default"},
        position_id_per_seconds=25, seconds_per_chunk=2, spatial_merge_size=2, **ids)
    # DiT attention kept block-local (no look-ahead/back layers) so that chunked decoding is exact
    token2wav = dict(
        dit_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_dim=16, ff_mult=2,
                        emb_dim=16, block_size=24, look_ahead_layers=[], look_backward_layers=[], repeats=2,
                        num_embeds=64, mel_dim=16, enc_emb_dim=16, enc_dim=16,
                        enc_channels=[32, 32, 32, 32, 96], enc_attention_channels=16, enc_se_channels=16),
        bigvgan_config=dict(mel_dim=16, upsample_initial_channel=64, resblock_kernel_sizes=[3],
                            resblock_dilation_sizes=[[1, 3, 5]]))
    return transformers.Qwen2_5OmniConfig(thinker_config=thinker, talker_config=talker,
                                          token2wav_config=token2wav, enable_audio_output=True)


def qwen3_config():
    ids = dict(audio_token_id=S["audio"], image_token_id=S["image"], video_token_id=S["video"],
               audio_start_token_id=S["audio_bos"], vision_start_token_id=S["vision_bos"],
               position_id_per_seconds=13)
    moe = dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
               decoder_sparse_step=1, mlp_only_layers=[])
    text = _text([1, 1, 2], head_dim=8, shared_expert_intermediate_size=0, **moe)
    text["rope_scaling"].update(interleaved=True, mrope_interleaved=True)
    thinker = dict(
        audio_config=dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
                          num_mel_bins=32, output_dim=32, downsample_hidden_size=8, n_window=50),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32,
                           deepstack_visual_indexes=[0], num_position_embeddings=64),
        text_config=text, audio_end_token_id=S["audio_eos"], vision_end_token_id=S["vision_eos"],
        user_token_id=WORDS["user"], seconds_per_chunk=2, **ids)
    talker = dict(
        text_config=dict(vocab_size=1056, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         shared_expert_intermediate_size=32, max_position_embeddings=4096,
                         rope_scaling={"mrope_section": [2, 3, 3], "rope_type": "default", "type": "default",
                                       "interleaved": True}, **moe),
        code_predictor_config=dict(vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_code_groups=4),
        num_code_groups=4, thinker_hidden_size=32, accept_hidden_layer=1, codec_pad_id=1040, codec_bos_id=1041,
        codec_eos_token_id=1042, codec_nothink_id=1043, codec_think_bos_id=1044, codec_think_eos_id=1045,
        speaker_id={"chelsie": 1046, "ethan": 1047}, spatial_merge_size=2, seconds_per_chunk=2, **ids)
    # the released code2wav geometry (upsampling 2·2·8·5·4·3 = 1920 samples per frame) at tiny width;
    # a narrow attention window keeps the receptive field inside the left context
    code2wav = dict(codebook_size=32, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                    sliding_window=8, intermediate_size=48, num_hidden_layers=1, num_quantizers=4, decoder_dim=32)
    return transformers.Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
        im_start_token_id=S["im_start"], im_end_token_id=S["im_end"], tts_pad_token_id=S["tts_pad"],
        tts_bos_token_id=S["tts_bos"], tts_eos_token_id=S["tts_eos"], system_token_id=WORDS["system"],
        user_token_id=WORDS["user"], assistant_token_id=WORDS["assistant"])


def save_checkpoint(arch: str, root) -> None:
    """What a real checkpoint directory holds: config.json, weights, tokenizer (+ spk_dict.pt,
    preprocessor_config.json where the release has them)."""
    torch.manual_seed(0)
    if arch == "qwen2_5_omni":
        model = transformers.Qwen2_5OmniForConditionalGeneration(qwen25_config()).eval()
    else:
        model = transformers.Qwen3OmniMoeForConditionalGeneration(qwen3_config()).eval()
    with torch.no_grad():
        # transformers initialises the talker's experts in an order that depends on the string
        # hash seed: draw them again from one seeded generator, so every process gets the same
        # checkpoint (and replies of the same length)
        gen = torch.Generator().manual_seed(3)
        for name, param in model.named_parameters():
            if ".experts." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
        # let the random thinker speak lower-case ASCII (readable text deltas, no EOS): keep only
        # the lm_head rows of "a".."z" and " "
        head = model.thinker.lm_head.weight
        keep = torch.zeros(head.shape[0], dtype=torch.bool)
        keep[list(range(97, 123)) + [32]] = True
        head[~keep] = 0.0
        head[keep] *= 4.0
    model.save_pretrained(root)
    make_tokenizer().save_pretrained(root)
    if arch == "qwen2_5_omni":
        gen = torch.Generator().manual_seed(7)
        torch.save({name: {"cond": torch.randn(16, generator=gen) * 0.5,
                           "ref_mel": torch.randn(1, 40, 16, generator=gen) * 0.5, "bos_token": S[tok]}
                    for name, tok in (("Chelsie", "spk_chelsie"), ("Ethan", "spk_ethan"))}, root / "spk_dict.pt")
    else:
        (root / "preprocessor_config.json").write_text(json.dumps({
            "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 32, "sampling_rate": 16000,
            "hop_length": 160, "chunk_length": 300, "n_fft": 400, "padding_value": 0.0, "dither": 0.0,
            "return_attention_mask": True, "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16,
            "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 3136, "max_pixels": 12845056,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))


ARCHS = ["qwen2_5_omni", "qwen3_omni_moe"]
#: chunking used by the tests (codec frames)
CHUNKS = {"qwen2_5_omni": dict(first_chunk_frames=4, chunk_frames=8, left_context_frames=24, lookahead_frames=2),
          "qwen3_omni_moe": dict(first_chunk_frames=2, chunk_frames=3, left_context_frames=25, lookahead_frames=0)}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny tensors: torch's intra-op threads only add overhead (and the CPU is shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=ARCHS)
def omni(request, tmp_path_factory):
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    save_checkpoint(arch, root)
    model = OmniModel(root, OmniSettings(talker_do_sample=False, seed=0, talker_max_frames=48, **CHUNKS[arch]))
    model.load()
    yield model
    model.close()


def user_audio(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(16_000 * seconds)) / 16_000
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)
    return (wave * 32767).astype(np.int16)


def request(messages, max_tokens=10, instructions="Be brief."):
    return ThinkRequest(instructions=instructions, messages=messages, max_output_tokens=max_tokens,
                        voice="alloy", want_audio=True)


def run_turn(session, req, voice="alloy"):
    """Drive think → talk → decode the way the pipeline does (talk on every boundary)."""
    outputs, chunks, audio, events = [], [], [], []
    cancelled = threading.Event()
    pending = []
    for out in session.think(req):
        outputs.append(out)
        pending.append(out)
        end = out.hidden.end
        n = session.talk_boundary(pending, final=end)
        segment, pending = pending[:n], pending[n:]
        for t in session.talk(segment, voice, cancelled, final=end):
            chunks.append(t)
            audio.append(session.decode(t))
            events.append(("audio", len(outputs)))
    return outputs, chunks, audio, events


# ---------------------------------------------------------------------------------------------
# (1) a streamed turn with audio in


def test_stream_turn_audio_in(omni):
    session = omni.open_session()
    try:
        image = np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)
        msg = TurnMessage(role="user", text="hi", audio=user_audio(1.0), images=[image])
        outputs, chunks, audio, events = run_turn(session, request([msg], max_tokens=12))
        assert outputs and outputs[-1].hidden.end
        assert all(o.prefilled_tokens == o.prompt_tokens for o in outputs)  # first turn: all new
        first = outputs[0]  # opens the reply; its talker prompt waits in the session, not on it
        assert first.hidden.opens and session.thinker.token_rows.prompt(first.hidden.turn) is not None
        # the thinker saw the audio placeholders and the image placeholders
        ids = session.thinker.ctx.ids
        assert ids.count(S["audio"]) > 10 and ids.count(S["image"]) >= 1
        assert chunks and chunks[-1].final
        assert all(isinstance(c.codes, CodeChunk) for c in chunks)
        n_frames = sum(len(c.codes) for c in chunks)
        assert n_frames > 0
        # the talker started on the first thinker tokens, not on the finished reply
        assert events[0][1] < len(outputs)
        pcm = np.concatenate(audio)
        assert pcm.dtype == np.int16 and omni.info.output_rate == 24_000
        assert pcm.size == omni.codec.rendered_length(n_frames)
        assert omni.info.hears_audio and {"audio_in", "text_in", "image_in", "audio_out"} <= omni.info.capabilities
    finally:
        session.close()


def test_streaming_equals_one_shot_generate(omni):
    """Greedy thinker tokens and talker codes match the reference ``generate``, step for step.

    The session steps alone: a batched step's float sums depend on its bucket (the rows other
    sessions hold), which can flip a near-tie of these random weights; batched sessions are
    compared with sessions alone in test_omni_batching."""
    loaded = omni.loaded
    batching, omni.batching = omni.batching, None
    try:
        session = omni.open_session()
    finally:
        omni.batching = batching
    try:
        msg = TurnMessage(role="user", text="hello", audio=user_audio(0.8, seed=3))
        outputs, chunks, _audio, _ = run_turn(session, request([msg], max_tokens=8))
        reply = session.thinker.ctx.reply
        prompt_len = reply.content_start
        stream_tokens = [o.hidden.token_id for o in outputs if o.hidden.token_id >= 0]
        stream_codes = torch.cat([c.codes.codes for c in chunks if len(c.codes)], dim=0)
        r = session.thinker.renderer.render(msg)
        feats = log_mel(loaded.feature_extractor, r.audio_clips, loaded.device)[0][None]
        input_ids = torch.tensor([session.thinker.ctx.ids[:prompt_len]])
    finally:
        session.close()

    captured = {}
    model = loaded.model
    kw = dict(thinker_max_new_tokens=8, talker_max_new_tokens=48, talker_do_sample=False,
              thinker_do_sample=False, input_features=feats,
              feature_attention_mask=torch.ones((1, feats.shape[-1]), dtype=torch.long))
    # the reference hands its talker codes to the codec: record them there
    if loaded.arch == "qwen2_5_omni":
        model.speaker_map = dict(loaded.speakers)
        owner, name, extra = model.token2wav, "forward", {"talker_eos_token_id": [60, 62]}
    else:
        owner, name, extra = model.code2wav, "chunked_decode", {"thinker_eos_token_id": loaded.tokens.im_end}
    original = getattr(owner, name)

    def record(codes, **k):
        captured["codes"] = codes.clone()
        return original(codes, **k)

    setattr(owner, name, record)
    try:
        seq, _wav = model.generate(input_ids=input_ids, speaker=loaded.default_speaker, **extra, **kw)
    finally:
        delattr(owner, name)  # back to the class method
    ref_codes = captured["codes"][0]
    if loaded.arch == "qwen3_omni_moe":
        ref_codes = ref_codes.t()  # (groups, frames) → (frames, groups)
    ref_tokens = seq[0, prompt_len:].tolist()
    assert stream_tokens == ref_tokens
    assert stream_codes.shape == ref_codes.shape
    assert torch.equal(stream_codes, ref_codes.cpu())


# ---------------------------------------------------------------------------------------------
# (2) chunked codec output against one-shot decoding


def test_chunked_codec_matches_one_shot(omni):
    loaded = omni.loaded
    gen = torch.Generator().manual_seed(5)
    if loaded.arch == "qwen2_5_omni":
        # block-aligned windows (12 codes = one 24-frame DiT block), 24 codes of left context and
        # 6 held back: the tiny DiT attends within blocks, BigVGAN's receptive field is < 6 codes
        codec = OmniCodec(loaded, CodecSettings(left_context_frames=24, lookahead_frames=6, crossfade_ms=0.0))
        codes = torch.randint(0, 60, (60,), generator=gen)
        sizes = [12, 12, 12, 12, 12]
        # our DiT sampler is the reference one given the same start noise
        spk = loaded.speakers[loaded.default_speaker]
        torch.manual_seed(11)
        with torch.inference_mode():
            ref = loaded.model.token2wav(codes[None], conditioning=spk["cond"][None], reference_mel=spk["ref_mel"])
        torch.manual_seed(11)
        noise = torch.randn(1, codes.numel() * 2, codec.mel_dim)[0]
        mine = codec.render(codes, 0, loaded.default_speaker, noise=noise)
        np.testing.assert_allclose(mine, ref.reshape(-1).numpy(), atol=1e-5)
    else:
        codec = OmniCodec(loaded, CodecSettings(left_context_frames=25))
        codes = torch.randint(0, 32, (30, 4), generator=gen)
        sizes = [2, 3, 3, 3, 3, 3, 3, 3, 3, 4]
        with torch.inference_mode():
            ref = loaded.model.code2wav.chunked_decode(codes.t()[None], chunk_size=300, left_context_size=25)
        assert codec.lost == 555
        np.testing.assert_allclose(codec.decode_full(codes), ref.reshape(-1).float().numpy(), atol=1e-6)
    full = codec.decode_full(codes, loaded.default_speaker, seed=3)
    stream = CodecStream.of(codec, turn=1, speaker=loaded.default_speaker, seed=3)
    parts, start = [], 0
    for i, size in enumerate(sizes):
        final = i == len(sizes) - 1
        parts.append(stream.push(codes[start : start + size], start=start, final=final))
        start += size
    assert parts[0].size > 0  # the first chunk is audible at once
    chunked = np.concatenate(parts)
    assert np.abs(full).max() > 0 and np.isfinite(full).all()
    assert chunked.size == full.size == codec.rendered_length(codes.shape[0])
    # tolerance: float32 rounding, with the left context covering the receptive field (relative
    # to the level: the tiny Qwen2.5 vocoder's output is about 1e-9)
    np.testing.assert_allclose(chunked, full, rtol=0, atol=1e-4 * float(np.abs(full).max()))


def test_a_reply_s_last_window_reaches_back_to_a_captured_length(omni):
    """A reply's last window has a length of its own, and a shape not captured runs eagerly (4-5
    times the device time on the GPU). Given the lengths that replay a graph, the last window
    starts further back, block-aligned, to take one of them; the audio still matches one-shot
    decoding. Off CUDA nothing is captured, so the test names the lengths."""
    loaded = omni.loaded
    gen = torch.Generator().manual_seed(6)
    if loaded.arch == "qwen2_5_omni":
        settings = CodecSettings(left_context_frames=24, lookahead_frames=6, crossfade_ms=0.0)
        codes, sizes = torch.randint(0, 60, (60,), generator=gen), [12] * 5
        # 54 would start at code 6, not on a 12-code block: the window takes 60
        default_last, captured, stretched = 48, [24, 54, 60], 60
    else:
        settings = CodecSettings(left_context_frames=25)
        codes, sizes = torch.randint(0, 32, (45, 4), generator=gen), [2, 3, 4, 4, 8, 8, 8, 8]
        # 34: the left context plus the frame whose tail was held back
        default_last, captured, stretched = 34, [12, 35, 40], 35
    codec = OmniCodec(loaded, settings)
    full = codec.decode_full(codes, loaded.default_speaker, seed=3)
    begin = codec.begin
    for lengths, expected in (([], default_last), (captured, stretched)):
        codec.last_window_lengths = lengths
        windows: list[int] = []

        def recording(window, *args, **kwargs):
            windows.append(len(window))
            return begin(window, *args, **kwargs)

        codec.begin = recording
        try:
            stream = CodecStream.of(codec, turn=1, speaker=loaded.default_speaker, seed=3)
            parts, start = [], 0
            for i, size in enumerate(sizes):
                parts.append(stream.push(codes[start : start + size], start=start, final=i == len(sizes) - 1))
                start += size
        finally:
            del codec.begin
        assert windows[-1] == expected, windows
        chunked = np.concatenate(parts)
        assert chunked.size == full.size
        np.testing.assert_allclose(chunked, full, rtol=0, atol=1e-4 * float(np.abs(full).max()))


def test_the_last_window_lengths_are_single_windows_of_this_codec(omni, monkeypatch):
    """Only single windows of the codec's own key count as lengths a last window may take: a
    group bucket's graph (keyed by window key and batch size) replays only a batch."""
    codec = OmniCodec(omni.loaded, CodecSettings())
    prefix = codec.key_prefix
    keys = [(*prefix, 42), (*prefix, 54), ((*prefix, 54), 8), ((*prefix, 60), 4), ("other", 7)]
    monkeypatch.setattr(codec.windows, "captured_keys", lambda: keys)
    assert codec.captured_lengths() == [42, 54]


# ---------------------------------------------------------------------------------------------
# (3) resumable segments: the second turn prefills only its own tokens


def test_second_turn_prefills_only_new_tokens(omni):
    session = omni.open_session()
    try:
        first = TurnMessage(role="user", text="one", audio=user_audio(0.5, seed=4))
        outs1, _, _, _ = run_turn(session, request([first], max_tokens=6))
        reply_text = "".join(o.text for o in outs1)
        cached = session.cache_length
        assistant = TurnMessage(role="assistant", text=reply_text)
        second = TurnMessage(role="user", text="two", audio=user_audio(0.4, seed=5))
        outs2, _, _, _ = run_turn(session, request([first, assistant, second], max_tokens=6))
        renderer = session.thinker.renderer
        reply1 = [o.hidden.token_id for o in outs1 if o.hidden.token_id >= 0 and not o.hidden.eos]
        # a reply cut by max tokens leaves its last token un-forwarded (as the reference does);
        # it enters the cache with the next prefill
        unforwarded = (outs1[0].prompt_tokens + len(reply1)) - cached
        assert unforwarded in (0, 1)
        expected = (unforwarded + len(renderer.closing()) + len(renderer.render(second).ids)
                    + len(renderer.header("assistant")))
        assert outs2[0].prefilled_tokens == expected == session.last_prefill_tokens
        assert outs2[0].prompt_tokens == cached + expected
        assert expected < outs2[0].prompt_tokens / 2
    finally:
        session.close()
    # a fresh session given the same conversation prefills all of it
    fresh = omni.open_session()
    try:
        outs, _, _, _ = run_turn(fresh, request([first, assistant, second], max_tokens=2))
        # (the re-tokenized reply text may differ from the generated ids: random byte tokens)
        assert outs[0].prefilled_tokens == outs[0].prompt_tokens > outs2[0].prefilled_tokens
    finally:
        fresh.close()


def test_a_turn_prefilled_ahead_leaves_the_reply_only_its_header(omni):
    """``ModelSession.prefill``: the user's turn evaluated before the reply is asked for. The
    reply then evaluates only ``<|im_start|>assistant\n`` and says exactly what it says without
    the head start; a turn prefilled with other audio (the user spoke on) is cropped again."""
    first = TurnMessage(role="user", text="one", audio=user_audio(0.5, seed=4))
    second = TurnMessage(role="user", audio=user_audio(0.4, seed=5))
    other = TurnMessage(role="user", audio=user_audio(0.3, seed=6))

    def conversation(ahead: list[TurnMessage] | None, fresh_talker: bool = False) -> tuple[list, list, list]:
        session = omni.open_session()
        try:
            outs1, _, _, _ = run_turn(session, request([first], max_tokens=6))
            if fresh_talker:  # the second reply's talker prompt is run whole, as before it was kept
                session.talker.prefix.forget()
            assistant = TurnMessage(role="assistant", text="".join(o.text for o in outs1))
            messages = [first, assistant, second]
            renderer = session.thinker.renderer
            for pending in ahead or []:
                evaluated = session.prefill(request([first, assistant, pending], max_tokens=6))
                assert evaluated >= len(renderer.render(pending).ids)
                assert session.prefill(request([first, assistant, pending], max_tokens=6)) == 0  # nothing new
            outs, chunks, audio, _ = run_turn(session, request(messages, max_tokens=6))
            # the talker's own rows: Qwen3 the 9-row assistant part; Qwen2.5 the header + 2
            talker_own = 9 if omni.loaded.arch == "qwen3_omni_moe" else len(renderer.header("assistant")) + 2
            if ahead and ahead[-1] is second:
                assert outs[0].prefilled_tokens == len(renderer.header("assistant"))
                assert session.talker.stream.rows_run == talker_own
            elif not fresh_talker:
                assert outs[0].prefilled_tokens > len(renderer.render(second).ids)
                # the first turn's rows stay in the talker's cache: only what is new runs
                assert talker_own < session.talker.stream.rows_run < outs[0].prompt_tokens
            return ([o.hidden.token_id for o in outs], [c.codes.codes.tolist() for c in chunks if c.codes is not None],
                    [a.tolist() for a in audio])
        finally:
            session.close()

    plain = conversation(None)
    assert conversation(None, fresh_talker=True) == plain  # the kept rows are what a whole run computes
    assert conversation([second]) == plain
    assert conversation([other]) == plain  # prefilled with what the user did not end on
    assert conversation([other, second]) == plain


def test_no_prefill_ahead_while_a_reply_runs(omni):
    session = omni.open_session()
    try:
        first = TurnMessage(role="user", text="one")
        replying = session.think(request([first], max_tokens=6))
        next(replying)
        assert session.prefill(request([first, TurnMessage(role="user", text="two")])) == 0
        replying.close()
        assert session.prefill(request([first, TurnMessage(role="user", text="two")])) > 0
    finally:
        session.close()


# ---------------------------------------------------------------------------------------------
# (4) barge-in: the cache is cut back to the confirmed position


def test_barge_in_confirm_crops_cache(omni):
    session = omni.open_session()
    try:
        msg = TurnMessage(role="user", text="tell me", audio=user_audio(0.5, seed=6))
        outs, _, _, _ = run_turn(session, request([msg], max_tokens=10))
        reply = session.thinker.ctx.reply
        prompt_len = reply.content_start
        tokens = [o for o in outs if o.hidden.token_id >= 0 and not o.hidden.eos]
        assert len(tokens) >= 4
        heard = "".join(o.text for o in tokens[:3])
        session.confirm(heard)
        kept = sum(1 for end in np.cumsum([len(o.text) for o in tokens[:3]]) if end <= len(heard))
        assert session.cache_length == prompt_len + kept == len(session.thinker.ctx.ids)
        assert session.thinker.ctx.ids[prompt_len:] == [o.hidden.token_id for o in tokens[:kept]]
        # the next turn re-uses the confirmed reply and never sees the unheard tokens
        nxt = TurnMessage(role="user", text="go on")
        outs2, _, _, _ = run_turn(session, request([msg, TurnMessage(role="assistant", text=heard), nxt],
                                                   max_tokens=3))
        renderer = session.thinker.renderer
        assert outs2[0].prefilled_tokens == (len(renderer.closing()) + len(renderer.render(nxt).ids)
                                             + len(renderer.header("assistant")))
        assert [o.hidden.token_id for o in tokens[kept:]] != session.thinker.ctx.ids[
            prompt_len + kept : prompt_len + len(tokens)]
        # cropping by position works too
        position = outs2[0].prompt_tokens - 5
        assert session.crop(position) == position == session.cache_length
    finally:
        session.close()
    assert session.cache_length == 0  # close() frees the KV cache


# ---------------------------------------------------------------------------------------------
# (5) cancellation stops within one chunk


def test_cancellation_stops_within_one_chunk(omni):
    session = omni.open_session()
    try:
        req = request([TurnMessage(role="user", text="talk", audio=user_audio(0.3))], max_tokens=40)
        gen = session.think(req)
        outs = [next(gen), next(gen)]
        req.cancelled.set()
        assert list(gen) == []  # the thinker stops at the next token
        # the talker: cancel after its first chunk; nothing more comes out
        session2 = omni.open_session()
        req2 = request([TurnMessage(role="user", text="talk more")], max_tokens=6)
        outputs = list(session2.think(req2))
        cancelled = threading.Event()
        talk = session2.talk(outputs, "alloy", cancelled, final=True)
        first = next(talk)
        assert isinstance(first.codes, CodeChunk) and len(first.codes) >= 1
        cancelled.set()
        assert list(talk) == []
        session2.close()
        assert len(outs) == 2
    finally:
        session.close()


def test_a_superseded_reply_takes_no_further_step(omni):
    """The talker's caches are the session's: once a reply is stopped (barge-in) its generator
    steps no more, and the next reply starts cleanly on the same caches."""
    session = omni.open_session()
    try:
        outputs = list(session.think(request([TurnMessage(role="user", text="talk more")], max_tokens=12)))
        talk = session.talk(outputs, "alloy", threading.Event(), final=True)
        first = next(talk)
        assert isinstance(first.codes, CodeChunk)
        decoder = session.talker.decoder
        steps = decoder.length
        session.talker.stop()
        rest = list(talk)
        assert decoder.length == steps  # no step after the stop
        assert all(not isinstance(c.codes, CodeChunk) or c.codes.turn == first.codes.turn for c in rest)
        outputs = list(session.think(request([TurnMessage(role="user", text="again")], max_tokens=6)))
        chunks = list(session.talk(outputs, "alloy", threading.Event(), final=True))
        assert session.talker.decoder is decoder  # the same caches, reused
        assert chunks and chunks[-1].final and sum(len(c.codes) for c in chunks) > 0
    finally:
        session.close()


def test_a_reply_drained_after_close_allocates_nothing(omni):
    """A talk() generator made before the session closed (the client left mid-reply) ends
    without building new caches for the dead session."""
    session = omni.open_session()
    outputs = list(session.think(request([TurnMessage(role="user", text="bye")], max_tokens=4)))
    talk = session.talk(outputs, "alloy", threading.Event(), final=True)
    session.close()
    assert list(talk) == []
    assert session.talker.decoder is None and session.talker.frames is None


# ---------------------------------------------------------------------------------------------
# (6) bad paths: clear errors


def test_bad_paths_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        OmniModel(tmp_path / "missing")
    with pytest.raises(ValueError, match="no config.json"):
        OmniModel(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ValueError, match="unsupported architecture"):
        OmniModel(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        OmniModel(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    model = OmniModel(tmp_path)  # a config alone passes detection; loading reports the missing weights
    with pytest.raises(ValueError, match="no weights"):
        model.load()


def test_a_config_alone_speaks_with_random_weights_when_asked(tmp_path):
    """``engines.omni.random_weights`` (benchmarks of real-size shapes): the config is built
    with random weights instead of failing on the missing weight files."""
    full = tmp_path / "full"
    full.mkdir()
    save_checkpoint("qwen3_omni_moe", full)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((full / "config.json").read_text())
    with pytest.raises(ValueError, match="no weights"):
        OmniModel(bare, OmniSettings(device="cpu", dtype="float32")).load()
    settings = OmniSettings(random_weights=True, max_sessions=2, talker_max_frames=12, seed=0,
                            **CHUNKS["qwen3_omni_moe"])
    model = OmniModel(bare, settings)
    assert model.talker_settings.max_new_tokens == 12 and model.dtype == "float32"
    model.load()
    try:
        session = model.open_session()
        _, chunks, audio, _ = run_turn(session, request([TurnMessage(role="user", text="hi")], max_tokens=4))
        session.close()
        assert chunks and sum(len(a) for a in audio) > 0
    finally:
        model.close()


# ---------------------------------------------------------------------------------------------
# (6) the graph-safe pieces: in-graph sampling and the static cache's bounds


def test_graph_safe_sampling_draws_from_top_k_top_p():
    """The code predictor samples inside its CUDA graph; the draws must follow temperature →
    top-k → top-p exactly as the reference sampler's distribution does."""
    from realtime_omni.engines.omni.sampling import sample_top_k_top_p

    logits = torch.tensor([2.0, 1.6, 1.1, 0.4, 0.0, -1.0, -3.0])
    temperature, top_k, top_p = 0.9, 5, 0.8
    probs = torch.softmax(logits / temperature, dim=-1)
    kept = torch.zeros_like(probs)
    order = torch.argsort(probs, descending=True)[:top_k]
    mass = 0.0
    for i in order.tolist():  # the smallest prefix of the top-k whose mass reaches top_p
        kept[i] = probs[i]
        mass += float(probs[i] / probs[order].sum())
        if mass >= top_p:
            break
    expected = kept / kept.sum()
    gen = torch.Generator().manual_seed(0)
    n = 6000
    counts = torch.zeros_like(probs)
    for _ in range(n):
        counts[int(sample_top_k_top_p(logits, torch.rand(top_k, generator=gen), temperature, top_k, top_p))] += 1
    freq = counts / n
    assert torch.all(counts[expected == 0] == 0)  # never outside the top-p set
    sigma = torch.sqrt(expected * (1 - expected) / n)
    assert torch.all((freq - expected).abs() <= 5 * sigma + 1e-9), (freq, expected)


def test_context_past_the_static_cache_is_a_clear_error(omni):
    """The KV cache is static: a prompt that cannot fit is refused with a clear error before
    anything is written, and the session goes on with a prompt that fits."""
    from realtime_omni.engines.omni.thinker import StreamingThinker, ThinkerSettings

    settings = ThinkerSettings(max_new_tokens=8, cache_tokens=96, system_prompt="")
    thinker = StreamingThinker(omni.loaded, settings)
    try:
        long = TurnMessage(role="user", text="tell me everything " * 6)  # byte-level: > 96 tokens
        with pytest.raises(ValueError, match="context tokens"):
            list(thinker.run(request([long], max_tokens=4)))
        assert thinker.cache_length == 0
        outs = list(thinker.run(request([TurnMessage(role="user", text="hi")], max_tokens=4)))
        assert outs and outs[-1].hidden.end
        assert 0 < thinker.cache_length < 96
    finally:
        thinker.close()


def test_chunks_ramp_up_from_the_first_to_the_steady_size(omni):
    """First chunk, then the ramp, then steady chunks: each early chunk is small enough to be
    ready before the one before it has played."""
    settings = omni.talker_settings
    saved = (settings.first_chunk_frames, settings.ramp_frames, settings.chunk_frames, settings.ignore_eos)
    # random weights stop anywhere: run the talker to its frame limit
    settings.first_chunk_frames, settings.ramp_frames, settings.chunk_frames, settings.ignore_eos = 2, (3, 4), 5, True
    session = omni.open_session()
    try:
        _outputs, chunks, _audio, _events = run_turn(session, request([TurnMessage(role="user", text="hi")],
                                                                      max_tokens=16))
        sizes = [len(c.codes) for c in chunks if isinstance(c.codes, CodeChunk)]
        assert sum(sizes) >= 2 + 3 + 4 + 5 + 1  # long enough to reach the steady size
        assert sizes[:3] == [2, 3, 4]
        assert sizes[3:-1] and all(size == 5 for size in sizes[3:-1])
        assert 0 <= sizes[-1] <= 5 and chunks[-1].final  # the final chunk holds the rest
    finally:
        session.close()
        settings.first_chunk_frames, settings.ramp_frames, settings.chunk_frames, settings.ignore_eos = saved


def test_generators_match_their_device_with_or_without_an_index():
    """A session generator made for ``cuda`` reports ``cuda:0``; treating that as another device
    sent sampling to the default CUDA generator, which a capture in another thread can hold."""
    from realtime_omni.engines.omni.streams import same_device

    assert same_device("cuda", "cuda:0") and same_device("cpu", torch.device("cpu"))
    assert not same_device("cuda:1", "cuda") and not same_device("cpu", "cuda")


def test_serving_settings_reach_the_model_through_its_section(omni):
    """``realtime-omni serve --model omni:<dir>`` builds the model with the settings tree's
    ``engines.omni`` section (chunking, cache, graphs); a bad value is an error naming the field."""
    from pydantic import ValidationError

    from realtime_omni.engines.builders import resolve_builder
    from realtime_omni.engines.settings import EngineSettings

    engines = EngineSettings(omni=OmniSettings(first_chunk_frames=3, chunk_frames=6, ramp_frames=[4, 5],
                                               left_context_frames=7, cache_tokens=512, cuda_graphs=False))
    model = resolve_builder(f"omni:{omni.path}", engines=engines)()
    assert (model.first_chunk_frames, model.ramp_frames, model.chunk_frames) == (3, (4, 5), 6)
    assert model.left_context_frames == 7 and model.device == "cpu" and model.dtype == "float32"
    assert model.thinker_settings.cache_tokens == 512 and not model.cuda_graphs
    assert model.talker_settings.ramp_frames == (4, 5)
    with pytest.raises(ValidationError, match="chunk_frames"):
        engines.omni.chunk_frames = 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_rms_norm_computes_what_transformers_does(dtype):
    """On CUDA the omni models' RMSNorms run as torch's one-kernel ``rms_norm``; the result must
    be transformers' own (to rounding), and norms of another shape of code stay as they are."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as q3

    from realtime_omni.engines.omni.fused import fuse_rms_norms

    dt = getattr(torch, dtype)
    norm = q3.Qwen3OmniMoeTextRMSNorm(64, eps=1e-6).to(dt)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    other = torch.nn.LayerNorm(64).to(dt)
    model = torch.nn.Sequential(norm, other)
    x = torch.randn(3, 5, 64, dtype=dt) * 4
    want = norm(x)
    assert fuse_rms_norms(model) == 1
    got = norm(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 1e-5 if dtype == "float32" else 3e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert fuse_rms_norms(model) == 0  # once is enough
    assert fuse_rms_norms(torch.nn.Sequential(other)) == 0


@pytest.mark.parametrize("q_len,mask_kind", [(1, "none"), (2, "none"), (1, "bool"), (2, "bool"), (2, "additive")])
def test_short_attention_computes_what_sdpa_does(q_len, mask_kind):
    """The code predictor's attention on CUDA (three kernels instead of SDPA's): the same result
    with grouped K/V heads, whatever form the mask comes in."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from realtime_omni.engines.omni.fused import short_attention

    gen = torch.Generator().manual_seed(q_len)
    batch, heads, kv_heads, kv_len, dim = 3, 8, 2, 17, 16
    q = torch.randn(batch, heads, q_len, dim, generator=gen)
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=gen)
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=gen)
    lengths = torch.tensor([5, 9, 17])  # each row has written this many columns
    visible = torch.arange(kv_len)[None, :] < lengths[:, None]
    causal = torch.ones((q_len, kv_len), dtype=torch.bool).tril(kv_len - q_len)  # the queries are the last keys
    allowed = (visible[:, None, :] & causal[None])[:, None]  # (B, 1, q, kv)
    mask = {"none": None, "bool": allowed,
            "additive": torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))}[mask_kind]
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups, module.training = True, heads // kv_heads, False
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=dim ** -0.5)
    got, _ = short_attention(module, q, k, v, mask, scaling=dim ** -0.5)
    assert got.shape == want.shape == (batch, q_len, heads, dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _code_predictor(layers: int):
    """Qwen3's code predictor of the tiny config with ``layers`` layers and random weights, and
    what :func:`frame_step` reads of a loaded model."""
    import types

    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qwen3

    talker_config = qwen3_config().talker_config
    settings = talker_config.code_predictor_config.to_dict()
    settings.update(num_hidden_layers=layers, layer_types=None)
    cp_config = type(talker_config.code_predictor_config)(**settings)
    torch.manual_seed(11)
    cp = qwen3.Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration._from_config(
        cp_config, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in cp.named_parameters():  # norms near one, the rest large enough to matter
            param.copy_(1.0 + 0.1 * torch.randn_like(param) if "norm" in name else 0.3 * torch.randn_like(param))
    width = talker_config.text_config.hidden_size
    talker = types.SimpleNamespace(code_predictor=cp, codec_head=torch.nn.Linear(width, 4),
                                   model=types.SimpleNamespace(codec_embedding=torch.nn.Embedding(
                                       talker_config.text_config.vocab_size, width)))
    return types.SimpleNamespace(talker=talker, config=types.SimpleNamespace(talker_config=talker_config),
                                 cache_kwarg="past_key_values", device=torch.device("cpu"))


@pytest.mark.parametrize("sample", [False, True])
def test_the_lean_code_predictor_frame_gives_the_modules_codes(sample):
    """The frame laid out for fewer kernels (q, k, v in one projection, norms' weights in the
    rotary tables, the cache read at its written columns, residuals in the projections) gives
    the codes and embeddings transformers' modules give, over several layers and rows."""
    from realtime_omni.engines.omni.code_predictor import CodePredictorSpec, frame_step
    from realtime_omni.engines.omni.code_predictor_lean import supports

    loaded = _code_predictor(layers=3)
    assert supports(loaded.talker.code_predictor)
    spec = CodePredictorSpec.of(loaded)
    width = loaded.config.talker_config.text_config.hidden_size
    for bucket in (1, 5):
        gen = torch.Generator().manual_seed(bucket)
        inputs = (torch.randn((bucket, width), generator=gen), torch.randint(0, 32, (bucket, 1), generator=gen),
                  torch.rand((bucket, spec.groups - 1, spec.top_k), generator=gen))
        with torch.inference_mode():
            want = frame_step(loaded, sample, lean=False)(bucket, None, inputs)()
            lean = frame_step(loaded, sample, lean=True)(bucket, None, inputs)
            got, again = lean(), lean()  # the step's cache is rewritten, not accumulated
        assert want[0].shape == (bucket, spec.groups - 1) and len(set(want[0].flatten().tolist())) > 2
        assert torch.equal(got[0], want[0]) and torch.equal(again[0], want[0])
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_short_attention_gives_the_code_predictor_the_same_codes():
    """Switched on for the code predictor run through transformers' modules (the frame's path
    where the lean layout does not apply), its codes do not change."""
    from realtime_omni.engines.omni.code_predictor import CodePredictorSpec, frame_step
    from realtime_omni.engines.omni.fused import use_short_attention

    loaded = _code_predictor(layers=2)
    config = loaded.talker.code_predictor.model.config
    spec = CodePredictorSpec.of(loaded)
    inputs = (torch.randn((3, loaded.config.talker_config.text_config.hidden_size)),
              torch.randint(0, 32, (3, 1)), torch.rand((3, spec.groups - 1, spec.top_k)))

    def frame():
        with torch.inference_mode():
            return frame_step(loaded, True, lean=False)(3, None, inputs)()

    want = frame()
    use_short_attention(config)
    assert config._attn_implementation == "omni_short"
    got = frame()
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_audio_encoded_without_device_reads_equals_the_encoders_own(omni):
    """Qwen3's audio clips are encoded with their chunk layout computed on the host: the
    embeddings must be those of transformers' ``get_audio_features`` (clips across chunk and
    window boundaries, padded together)."""
    from realtime_omni.engines.omni.audio_tower import encode_audio

    model = omni
    if model.loaded.arch != "qwen3_omni_moe":
        pytest.skip("Qwen2.5-Omni's encoder runs as transformers has it")
    session = model.open_session()
    try:
        renderer = session.thinker.renderer
        clips = [renderer.render(TurnMessage(role="user", audio=user_audio(sec, seed=i))).audio_clips[0]
                 for i, sec in enumerate((0.4, 2.7, 1.3))]
    finally:
        session.close()
    feats = log_mel(model.loaded.feature_extractor, clips, model.loaded.device)
    frames = max(f.shape[-1] for f in feats)
    batch = torch.zeros((len(feats), feats[0].shape[0], frames))
    mask = torch.zeros((len(feats), frames), dtype=torch.long)
    for i, f in enumerate(feats):
        batch[i, :, : f.shape[-1]] = f
        mask[i, : f.shape[-1]] = 1
    with torch.inference_mode():
        want = model.loaded.thinker.model.get_audio_features(batch, mask).last_hidden_state
        got = encode_audio(model.loaded, feats)
    assert got.shape == want.shape and got.shape[0] > 30
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_features_computed_in_a_batch_equal_the_feature_extractors():
    """The prefill computes the log-mel features of all its clips in one batch on the device;
    each clip's frames must be those the checkpoint's extractor gives it alone (lengths below
    the 0.1 s floor, off the hop grid, across the encoder's chunk, and the int16 scaling)."""
    from transformers import WhisperFeatureExtractor

    from realtime_omni.engines.omni.audio_features import clip_waveform

    fe = WhisperFeatureExtractor(feature_size=128, sampling_rate=16_000, hop_length=160, chunk_length=300,
                                 n_fft=400, padding_value=0.0, dither=0.0, return_attention_mask=True)
    rng = np.random.default_rng(5)
    clips = [clip_waveform((rng.standard_normal(n) * 3000).astype(np.int16)) for n in (500, 1_600, 19_751, 67_200)]
    clips.append(clip_waveform(np.zeros(4_000, np.float32)))  # silence: the floor alone
    got = log_mel(fe, clips, torch.device("cpu"))
    for clip, features in zip(clips, got, strict=True):
        padded = -(-(clip.size + 400) // 160) * 160
        alone = fe(clip, sampling_rate=16_000, return_attention_mask=True, padding="max_length",
                   max_length=padded, truncation=False, return_tensors="pt")
        frames = int(alone["attention_mask"][0].sum())
        torch.testing.assert_close(features, alone["input_features"][0][:, :frames], rtol=0, atol=1e-6)
    assert clips[0].size == 1_600 and clips[2].size == 19_751


def test_clips_are_batched_by_similar_length():
    """A prefill's clips are padded together only with clips of similar length: every clip once,
    and no batch padded past 4/3 of its clips' samples (a 300 s clip among 32 clips of 4 s would
    otherwise pad each of them to 300 s)."""
    from realtime_omni.engines.omni.audio_features import length_groups

    rng = np.random.default_rng(2)
    for lengths in ([64_000] * 32 + [4_800_000], list(rng.integers(1_600, 400_000, 50)), [1_600], []):
        groups = length_groups([int(n) for n in lengths])
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for group in groups:
            assert max(lengths[i] for i in group) * len(group) <= 4 / 3 * sum(lengths[i] for i in group) + 1
    assert length_groups([64_000] * 32 + [4_800_000])[0] == [32]
    assert len(length_groups([64_000] * 32)) == 1  # a burst of equal turns: one batch


def test_token_rows_keep_the_newest_turn():
    """A superseded reply's thread that puts late must not wipe what the newer reply put."""
    from realtime_omni.engines.omni.context import TalkerPrompt, TokenRows

    rows = TokenRows()
    prompt = TalkerPrompt(turn=2)
    rows.put_prompt(2, prompt)
    rows.put(2, 0, "row of turn 2")
    rows.put(1, 5, "late row of turn 1")
    rows.put_prompt(1, TalkerPrompt(turn=1))
    assert rows.prompt(2) is prompt and rows.prompt(1) is None
    assert rows.take(1, 5) is None and rows.take(2, 0) == "row of turn 2" and rows.take(2, 0) is None
    rows.put(3, 0, "row of turn 3")  # a newer turn drops the last one's
    assert rows.prompt(2) is None and rows.take(3, 0) == "row of turn 3"


def test_a_live_replys_record_is_fingerprinted_by_its_text_so_far_until_settled():
    """A reply's message record is compared by its text as it stands when the next turn looks
    (not rebuilt at every token); a cut or a finished call settles it for good."""
    from realtime_omni.engines.omni.context import MessageRecord, ReplyState

    record = MessageRecord(("assistant", ""), 10, 12, closed=False)
    reply = ReplyState(turn=1, record=record, content_start=12)
    record.live = reply
    assert record.current() == ("assistant", "")
    reply.text = " Hello,\n  there "
    assert record.current() == ("assistant", "Hello, there")
    record.settle(("assistant", "Hello,"))
    reply.text += "more"  # a settled record no longer follows the reply
    assert record.current() == ("assistant", "Hello,") and record.live is None


def test_reply_tokens_left_for_later_are_embedded_when_the_context_is_read():
    """Qwen3's batched thinker hands no vector per reply token: the context embeds those tokens
    in one call when a talker prompt reads it, in their own rows, and forgets those cut away."""
    import types

    import torch

    from realtime_omni.engines.omni.context import ThinkerContext

    table = torch.nn.Embedding(50, 4)
    tokens = types.SimpleNamespace(audio=48, image=49)
    ctx = ThinkerContext()
    ctx.src.append(torch.full((3, 4), 7.0))  # a prefill's rows
    ctx.ids += [1, 2, 3]
    ctx.mm += [False] * 3
    for pos, token in enumerate([11, 12, 13], start=3):
        ctx.append_token(token, pos, None, tokens)
    ctx.append_token(14, 6, torch.full((4,), -1.0), tokens)  # a vector handed over as before
    ctx.crop(5)  # 13 and 14 cut away: 13 must not be written over what comes next
    ctx.append_token(15, 5, None, tokens)
    rows = ctx.source_rows(table, 6)
    with torch.no_grad():
        assert torch.equal(rows[:3], torch.full((3, 4), 7.0))
        assert torch.equal(rows[3:], table(torch.tensor([11, 12, 15])))
    assert ctx.embed_later == []  # embedded once
    with pytest.raises(ValueError):
        ThinkerContext().append_token(1, 0, None, tokens)  # no row shape to skip by yet


def live_turn(session, req, voice="alloy", cancel_after: int | None = None):
    """Drive think → talk_live the way the pipeline does where the model talks live: one talker
    call for the reply in its own thread, fed each thinker output as it comes."""
    cancelled = threading.Event()
    chunks: list = []
    done = threading.Event()
    errors: list = []

    def speak():
        try:
            for out in session.talk_live(cancelled):
                chunks.append(out)
                if cancel_after is not None and len(chunks) >= cancel_after:
                    cancelled.set()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            done.set()

    speaker = None
    outputs = []
    for index, out in enumerate(session.think(req)):
        outputs.append(out)
        session.talk_more([out], voice, final=out.hidden.end, first=index == 0)
        if speaker is None:
            speaker = threading.Thread(target=speak, daemon=True)
            speaker.start()
        time.sleep(0.002)  # tokens arrive over time, as from a streaming thinker
    assert done.wait(60), "the live talker did not finish"
    assert not errors, errors
    return outputs, chunks


def test_a_live_talker_fed_token_by_token_makes_what_talk_calls_make(omni):
    """One talk_live call fed each token makes the same codes (greedy) as a talk call per
    boundary, chunk for chunk, and ends with the final chunk."""
    req = request([TurnMessage(role="user", text="hello there", audio=user_audio(0.4))], max_tokens=12)
    first = omni.open_session()
    try:
        _outs, by_calls, _audio, _events = run_turn(first, req)
    finally:
        first.close()
    second = omni.open_session()
    try:
        _outs, live = live_turn(second, request(req.messages, max_tokens=12))
    finally:
        second.close()
    codes = lambda chunks: [c.codes.codes.tolist() for c in chunks if isinstance(c.codes, CodeChunk) and len(c.codes)]  # noqa: E731
    assert codes(live) == codes(by_calls) and codes(live)
    assert live[-1].final and not any(c.final for c in live[:-1])


def test_a_live_talker_stops_on_cancel_and_on_close(omni):
    session = omni.open_session()
    try:
        _outs, live = live_turn(session, request([TurnMessage(role="user", text="talk on")], max_tokens=30),
                                cancel_after=1)
        assert len(live) == 1  # nothing after the cancel
    finally:
        session.close()
    # a live talker waiting for tokens that never come ends when the reply is cancelled
    session = omni.open_session()
    try:
        cancelled = threading.Event()
        outs = list(session.think(request([TurnMessage(role="user", text="wait")], max_tokens=4)))
        session.talk_more(outs[:1], "alloy", final=False, first=True)
        talker = session.talk_live(cancelled)
        ended = threading.Event()
        threading.Thread(target=lambda: (list(talker), ended.set()), daemon=True).start()
        time.sleep(0.2)
        assert not ended.is_set()  # waiting for more of the reply
        began = time.monotonic()
        cancelled.set()
        assert ended.wait(2) and time.monotonic() - began < 0.5
    finally:
        session.close()


def test_a_live_talker_draws_what_talk_calls_draw_when_sampling(omni):
    """Sampled (the server's default), a session's draws come from its own seeded generator in
    the same order either way: the live talker's codes are the talk calls' codes."""
    settings = omni.talker_settings
    saved = settings.do_sample
    settings.do_sample = True
    try:
        req = lambda: request([TurnMessage(role="user", text="sample this", audio=user_audio(0.4, seed=5))],  # noqa: E731
                              max_tokens=12)
        codes = lambda chunks: [c.codes.codes.tolist() for c in chunks if isinstance(c.codes, CodeChunk)]  # noqa: E731
        first = omni.open_session()
        try:
            by_calls = codes(run_turn(first, req())[1])
        finally:
            first.close()
        second = omni.open_session()
        try:
            live = codes(live_turn(second, req())[1])
        finally:
            second.close()
        assert live == by_calls
    finally:
        settings.do_sample = saved


def test_a_reply_speaks_with_the_speaker_its_voice_names(omni):
    """The voice of a request (a session's, or one response's) picks the checkpoint's speaker by
    name, case aside, for the talker and the codec; other names take the default speaker."""
    spoken = {}
    for voice in ("chelsie", "Ethan", "alloy"):
        session = omni.open_session()
        try:
            _outs, chunks = live_turn(session, request([TurnMessage(role="user", text="hello there")], max_tokens=6),
                                      voice=voice)
        finally:
            session.close()
        chunks = [c.codes for c in chunks if isinstance(c.codes, CodeChunk) and len(c.codes)]
        spoken[voice] = {c.speaker.lower() for c in chunks}
    assert spoken == {"chelsie": {"chelsie"}, "Ethan": {"ethan"}, "alloy": {omni.loaded.default_speaker.lower()}}


def test_the_qwen25_codec_takes_its_flow_matching_steps_from_the_settings(omni):
    """``dit_steps`` reaches the codec a model builds, and is what its DiT runs: the reference
    token2wav at that step count gives the same audio."""
    if omni.loaded.arch != "qwen2_5_omni":
        pytest.skip("only Qwen2.5-Omni's codec has flow-matching steps")
    model = OmniModel(omni.path, OmniSettings(talker_do_sample=False, seed=0, dit_steps=3, **CHUNKS[omni.loaded.arch]))
    model.load()
    try:
        loaded, codec = model.loaded, model.codec
        assert codec.settings.dit_steps == 3
        codes = torch.randint(0, 60, (24,), generator=torch.Generator().manual_seed(5))
        spk = loaded.speakers[loaded.default_speaker]
        torch.manual_seed(11)
        with torch.inference_mode():
            ref = loaded.model.token2wav(codes[None], conditioning=spk["cond"][None], reference_mel=spk["ref_mel"],
                                         num_steps=3)
        torch.manual_seed(11)
        noise = torch.randn(1, codes.numel() * 2, codec.mel_dim)[0]
        mine = codec.render(codes, 0, loaded.default_speaker, noise=noise)
        # (the tiny codec's waveform peaks near 2e-8: compare relative to it)
        scale = float(np.abs(ref).max())
        assert scale > 0 and float(np.abs(mine - ref.reshape(-1).numpy()).max()) <= 1e-6 * scale
        ten = omni.codec.render(codes, 0, loaded.default_speaker, noise=noise)  # the fixture's: 10 steps
        assert float(np.abs(mine - ten).max()) > 1e-6 * scale
    finally:
        model.close()


def test_the_qwen25_dit_can_run_in_bfloat16_with_the_ode_kept_in_float32(omni):
    """``dit_dtype="bfloat16"`` puts the DiT's transformer in bfloat16 and leaves the speaker
    encoder, the vocoder and the ODE in float32: the audio of a window stays within a rounding
    distance of the float32 DiT's, and is not the same audio (the setting took effect)."""
    if omni.loaded.arch != "qwen2_5_omni":
        pytest.skip("only Qwen2.5-Omni's codec has a DiT")
    from realtime_omni.engines.omni.waveform import set_dit_dtype

    model = OmniModel(omni.path, OmniSettings(talker_do_sample=False, seed=0, dit_steps=3, dit_dtype="bfloat16",
                                              **CHUNKS[omni.loaded.arch]))
    model.load()
    try:
        loaded, codec = model.loaded, model.codec
        t2w = loaded.model.token2wav
        dit = t2w.code2wav_dit_model
        assert {p.dtype for p in dit.transformer_blocks.parameters()} == {torch.bfloat16}
        assert {p.dtype for p in dit.input_embed.spk_encoder.parameters()} == {torch.float32}
        assert {p.dtype for p in t2w.code2wav_bigvgan_model.parameters()} == {torch.float32}
        codes = torch.randint(0, 60, (24,), generator=torch.Generator().manual_seed(5))
        noise = torch.randn(codes.numel() * 2, codec.mel_dim, generator=torch.Generator().manual_seed(11))
        half = codec.render(codes, 0, loaded.default_speaker, noise=noise)
        set_dit_dtype(dit, "float32")
        full = codec.render(codes, 0, loaded.default_speaker, noise=noise)
        assert half.dtype == full.dtype == np.float32
        scale = float(np.abs(full).max())
        difference = float(np.abs(half - full).max())
        assert scale > 0 and 1e-7 * scale < difference < 1e-2 * scale
    finally:
        model.close()
