"""Qwen3-Omni's talker, step by step (see :mod:`.talker` for the recipe)."""

from __future__ import annotations

from typing import Any

from ..base import ThinkerOutput
from .device_copy import to_device
from .context import TalkerPrompt, TokenHidden
from .graphs import StaticDecoder
from .loader import LoadedOmni
from .talker_stream import CodeSampling, TalkerSettings, TalkerStream


#: Qwen3's batched talker input for a frame after the reply's text: its ``tts_eos`` (the frame
#: right after the last token), then ``tts_pad``; a reply token is its own id (>= 0); see
#: ``batching.talker_frames.TextParts``
TEXT_EOS, TEXT_PAD = -1, -2


class Qwen3Stream(TalkerStream):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        import torch

        loaded = self.loaded
        cfg = loaded.config
        tcfg = cfg.talker_config
        talker = loaded.talker
        self.groups = int(tcfg.num_code_groups)
        self.codec_eos = int(tcfg.codec_eos_token_id)
        self.embed_tokens = loaded.thinker.get_input_embeddings()
        special = torch.tensor([int(cfg.tts_bos_token_id), int(cfg.tts_eos_token_id), int(cfg.tts_pad_token_id)],
                               device=self.device)
        self.proj_dtype = talker.text_projection.linear_fc1.weight.dtype
        with torch.inference_mode():
            proj = talker.text_projection(self.embed_tokens(special).to(self.proj_dtype))
        self.tts_bos, self.tts_eos, self.tts_pad = proj[0], proj[1], proj[2]
        #: the header's raw thinker embeddings, then the reply's tokens: their embeddings, or
        #: (batched talker) their ids, which its step embeds and projects for every row at once
        self.assistant: list[Any] = []
        if self.prompt is not None:
            self.assistant = list(self.prompt.header_src)
        self.codes_hist: list[int] = []
        self.frame_embed = None
        self.hidden = None
        self.pos = 0

    @classmethod
    def code_sampling(cls, loaded: LoadedOmni, settings: TalkerSettings) -> CodeSampling:
        tcfg = loaded.config.talker_config
        vocab = int(tcfg.text_config.vocab_size)
        eos = int(tcfg.codec_eos_token_id)
        suppress = [i for i in range(max(0, vocab - 1024), vocab) if i != eos]
        if settings.ignore_eos:
            suppress.append(eos)
        return CodeSampling.make(loaded, settings, suppress, set() if settings.ignore_eos else {eos})

    def _groups(self) -> int:
        return self.groups

    def _max_frames(self) -> int:
        # the reference completes a frame's residual codebooks in the *next* step, so a run that
        # hits max_new_tokens drops its last frame
        return min(self.frame_limit, max(1, self.settings.max_new_tokens - 1))

    def add(self, out: ThinkerOutput) -> None:
        if out.hidden.prompt is not None and self.prompt is None and not self.prefilled:
            self.assistant = list(out.hidden.prompt.header_src)
        super().add(out)

    def _add_token(self, hidden: TokenHidden) -> None:
        import torch

        if hidden.token_id is None or hidden.token_id < 0:
            return
        if self.rows is not None:  # the batched talker: the id is its input (see TextParts)
            self.assistant.append(int(hidden.token_id))
            return
        with torch.inference_mode():
            emb = self.embed_tokens(to_device(torch.tensor([hidden.token_id]), self.device))[0]
        self.assistant.append(emb)

    def _embedding(self, entry: Any) -> Any:
        """An ``assistant`` entry as the thinker's embedding (a token id is embedded here)."""
        import torch

        if isinstance(entry, int):
            return self.embed_tokens(to_device(torch.tensor([entry]), self.device))[0]
        return entry

    def _can_prefill(self) -> bool:
        return self.prompt is not None and len(self.assistant) >= 4

    @classmethod
    def context_part(cls, loaded: LoadedOmni, prompt: TalkerPrompt) -> tuple[Any, Any] | None:
        """The talker's rows for the user turns of the context, at positions 0..U-1 (None when
        there are none, or images: their rotary positions are laid out with the whole prompt)."""
        import torch

        if any(it.kind == "image" for it in prompt.user_items):
            return None
        user = cls._user_rows(loaded, prompt)
        if user is None:
            return None
        n = user.shape[0]
        return user, torch.arange(n, dtype=torch.long).view(1, n).expand(3, n)

    @staticmethod
    def _user_rows(loaded: LoadedOmni, prompt: TalkerPrompt) -> Any:
        """User-turn tokens → talker rows: text through ``text_projection`` of the embedding,
        audio/image through ``hidden_projection`` of the thinker's hidden state."""
        import torch

        if prompt.user_src is None or not prompt.user_src.shape[0]:
            return None
        talker = loaded.talker
        proj_dtype = talker.text_projection.linear_fc1.weight.dtype
        dtype = talker.codec_head.weight.dtype
        device = loaded.device
        user = torch.empty((prompt.user_src.shape[0], loaded.config.talker_config.text_config.hidden_size),
                           device=device, dtype=dtype)
        src = prompt.user_src.to(proj_dtype)
        mm = prompt.user_mm.cpu()  # the rows are chosen on the host: no read back from the device
        for rows, project in ((mm, talker.hidden_projection), (~mm, talker.text_projection)):
            index = torch.nonzero(rows).reshape(-1)
            if index.numel():
                index = to_device(index, device)
                user.index_copy_(0, index, project(src.index_select(0, index)).to(dtype))
        return user

    def _prefill(self) -> None:
        import torch

        loaded, prompt = self.loaded, self.prompt
        cfg, tcfg = loaded.config, loaded.config.talker_config
        talker = loaded.talker
        dtype = talker.codec_head.weight.dtype
        context = self.context_part(loaded, prompt)
        user = context[0] if context is not None else self._user_rows(loaded, prompt)
        parts = [] if user is None else [user]
        head = torch.stack([self._embedding(e) for e in self.assistant[:4]])
        head = talker.text_projection(head.to(self.proj_dtype)).to(dtype)
        text_part = torch.cat([head[:3], self.tts_pad.expand(4, -1).to(dtype), self.tts_bos[None].to(dtype),
                               head[3:4]], dim=0)
        speaker_id = int(loaded.speakers.get(self.speaker, next(iter(loaded.speakers.values()))))
        specials = to_device(torch.tensor([int(tcfg.codec_nothink_id), int(tcfg.codec_think_bos_id),
                                           int(tcfg.codec_think_eos_id), speaker_id, int(tcfg.codec_pad_id),
                                           int(tcfg.codec_bos_id)]), self.device)
        codec_part = torch.cat([torch.zeros((3, text_part.shape[1]), device=self.device, dtype=dtype),
                                talker.model.codec_embedding(specials).to(dtype)], dim=0)
        parts.append(text_part + codec_part)
        inputs = torch.cat(parts, dim=0)[None]
        n = inputs.shape[1]
        positions = torch.arange(n, dtype=torch.long).view(1, n).expand(3, n)
        images = [it for it in prompt.user_items if it.kind == "image"]
        if images:
            ids = list(prompt.user_ids) + [int(cfg.tts_pad_token_id)] * text_part.shape[0]
            ids_t = torch.tensor([ids], dtype=torch.long)
            audios = [it.value for it in prompt.user_items if it.kind == "audio"]
            grid = torch.tensor([it.value for it in images], dtype=torch.long)
            # the thinker's get_rope_index: the talker's own copy reads ``audio_config`` from the
            # talker config, which has none (the reference generate fails on audio + image input)
            pos, _ = loaded.thinker.get_rope_index(ids_t, grid, None, torch.ones_like(ids_t), False,
                                                   torch.tensor(audios, dtype=torch.long) if audios else None,
                                                   None)
            positions = pos[:, 0, :].round().long()
        self.pos = int(positions.max()) + 1
        self.hidden, self.logits = self._prefill_with(inputs, positions,
                                                      context[0].shape[0] if context is not None else 0)

    @staticmethod
    def forward(loaded: LoadedOmni, decoder: StaticDecoder, inputs, positions):
        talker = loaded.talker
        out = talker.model(inputs_embeds=inputs, position_ids=positions.to(loaded.device).reshape(3, 1, -1),
                           use_cache=True, return_dict=True, **{loaded.cache_kwarg: decoder.cache})
        hidden = out.last_hidden_state[:, -1:, :]
        return hidden, talker.codec_head(hidden[:, -1, :]).float()

    @staticmethod
    def step_input(decoder: StaticDecoder) -> Any:
        return decoder.inputs[0]

    @classmethod
    def new_decoder(cls, loaded: LoadedOmni, settings: TalkerSettings, rows: Any = None) -> StaticDecoder:
        import torch

        talker = loaded.talker
        device = loaded.device
        decoder = cls.empty_decoder(loaded, settings, rows)
        width = int(loaded.config.talker_config.text_config.hidden_size)
        inputs = torch.zeros((1, 1, width), dtype=talker.codec_head.weight.dtype, device=device)
        positions = torch.zeros((3, 1), dtype=torch.long, device=device)
        decoder.inputs = (inputs, positions)
        decoder.bind(lambda: cls.forward(loaded, decoder, inputs, positions))
        return decoder

    def _trailing(self, k: int):
        index = 4 + k
        if index < len(self.assistant):
            embed = self._embedding(self.assistant[index])
            return self.loaded.talker.text_projection(embed[None].to(self.proj_dtype))[0]
        if not self.ended:
            return None
        return self.tts_eos if index == len(self.assistant) else self.tts_pad

    def _input_ready(self) -> bool:
        return 4 + self.steps - 1 < len(self.assistant) or self.ended

    def _forward_next(self) -> None:
        part = self._trailing(self.steps - 1)
        pos = self.pos
        self.pos += 1

        def fill(inputs, positions) -> None:
            inputs.copy_((self.frame_embed + part.to(self.frame_embed.dtype))[None, None, :])
            positions.fill_(pos)

        self.hidden, self.logits = self._step_with(fill)

    def _frame_hidden(self) -> Any:
        return self.hidden

    def _seen_codes(self) -> list[int]:
        return list(self.codes_hist)

    def _part_after_frame(self, ahead: int = 0) -> Any:
        """The batched talker's input: the reply token's id, or TEXT_EOS / TEXT_PAD after it."""
        index = 4 + self.steps + ahead
        if index < len(self.assistant):
            return self.assistant[index]
        if not self.ended:
            return None
        return TEXT_EOS if index == len(self.assistant) else TEXT_PAD

    def _append_frame(self, values: list[int]) -> bool:
        if values[0] in self.sampling.eos:
            return True
        self.codes_hist.append(values[0])
        self.frames.append(values)
        return False

    def _take_frame(self) -> bool:
        import torch

        history = torch.tensor([self.codes_hist], dtype=torch.long) if self.codes_hist else None
        c0 = self.sampler(self.logits, history)
        if c0 == self.codec_eos and not self.settings.ignore_eos:
            return True
        self.codes_hist.append(c0)
        with self._own_caches():
            codes, self.frame_embed = self.code_frames(self.hidden, c0)
        self.frames.append([c0, *codes])
        return False
