"""Qwen2.5-Omni's talker, step by step (see :mod:`.talker` for the recipe)."""

from __future__ import annotations

from typing import Any

from .context import TalkerPrompt, TokenHidden
from .device_copy import to_device
from .graphs import StaticDecoder
from .loader import LoadedOmni, samples_per_code
from .talker_stream import CodeSampling, TalkerSettings, TalkerStream


class Qwen25Stream(TalkerStream):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        import torch

        loaded = self.loaded
        talker = loaded.talker
        cfg = loaded.config.talker_config
        self.vecs: list[Any] = []
        self.frame_samples = samples_per_code(loaded)
        self.eos = set(self.sampling.eos)
        embed_tokens = loaded.thinker.get_input_embeddings()
        ids = torch.tensor([int(cfg.tts_text_end_token_id), int(cfg.tts_text_pad_token_id)], device=self.device)
        with torch.inference_mode():
            eos_pad = embed_tokens(ids)
        self.text_eos, self.text_pad = eos_pad[0], eos_pad[1]
        self.codec_embed = talker.model.embed_tokens
        self.history = None
        self.pos = 0
        self.last_code = None

    @classmethod
    def code_sampling(cls, loaded: LoadedOmni, settings: TalkerSettings) -> CodeSampling:
        cfg = loaded.config.talker_config
        eos = [int(cfg.tts_codec_pad_token_id), int(cfg.tts_codec_end_token_id)]
        kept_eos = set() if settings.ignore_eos else set(eos)
        suppress = [int(cfg.tts_codec_start_token_id)] + (eos if settings.ignore_eos else [])
        # ids token2wav cannot embed (>= num_embeds + 1: mask/bos/...), EOS excepted; a trained
        # talker never samples them, a random one does
        t2w = getattr(loaded.config, "token2wav_config", None)
        if t2w is not None:
            first_bad = int(t2w.dit_config.num_embeds) + 1
            suppress += [i for i in range(first_bad, int(cfg.vocab_size)) if i not in kept_eos]
        return CodeSampling.make(loaded, settings, suppress, kept_eos)

    def _add_token(self, hidden: TokenHidden) -> None:
        vec = self.token_rows.take(hidden.turn, hidden.index)
        if vec is not None and not hidden.eos:
            self.vecs.append(vec)

    def _can_prefill(self) -> bool:
        return self.prompt is not None and len(self.vecs) >= 1

    def _prefill(self) -> None:
        import torch

        loaded, prompt, cfg = self.loaded, self.prompt, self.loaded.config.talker_config
        spk = loaded.speakers[self.speaker]
        embed_tokens = loaded.thinker.get_input_embeddings()
        bos_embed = embed_tokens(to_device(torch.tensor([spk["bos_token"]]), self.device))
        inputs = torch.cat([prompt.src, bos_embed.to(prompt.src.dtype), self.vecs[0][None]], dim=0)[None].clone()
        codec = self.codec_embed(to_device(torch.tensor([int(cfg.tts_codec_pad_token_id),
                                                         int(cfg.tts_codec_start_token_id)]), self.device))
        inputs[:, -2, :] += codec[0]
        inputs[:, -1, :] += codec[1]
        p = prompt.next_pos
        extra = torch.tensor([[p, p, p], [p + 1, p + 1, p + 1]], dtype=torch.long, device=prompt.positions.device)
        positions = torch.cat([prompt.positions, extra], dim=0).t()  # (3, n)
        self.pos = p + 2
        n_prompt = prompt.src.shape[0]
        self.history = torch.tensor(
            [[int(cfg.tts_codec_mask_token_id)] * n_prompt
             + [int(cfg.tts_codec_pad_token_id), int(cfg.tts_codec_start_token_id)]], dtype=torch.long)
        self.logits = self._prefill_with(inputs, positions, n_prompt)

    @classmethod
    def context_part(cls, loaded: LoadedOmni, prompt: TalkerPrompt) -> tuple[Any, Any] | None:
        """The talker's rows for the whole thinker context, at the thinker's positions."""
        if prompt.src is None or not prompt.src.shape[0]:
            return None
        return prompt.src, prompt.positions.t()

    @staticmethod
    def forward(loaded: LoadedOmni, decoder: StaticDecoder, inputs, positions):
        talker = loaded.talker
        x = talker.thinker_to_talker_proj(inputs.to(talker.thinker_to_talker_proj.weight.dtype))
        out = talker.model(inputs_embeds=x, position_ids=positions.to(loaded.device).view(3, 1, -1),
                           use_cache=True, return_dict=True, **{loaded.cache_kwarg: decoder.cache})
        return talker.codec_head(out.last_hidden_state[:, -1, :]).float()

    @staticmethod
    def step_input(decoder: StaticDecoder) -> Any:
        return decoder.inputs[1]  # the reply part; the code embedding is added in the step

    @classmethod
    def new_decoder(cls, loaded: LoadedOmni, settings: TalkerSettings, rows: Any = None) -> StaticDecoder:
        import torch

        talker = loaded.talker
        device = loaded.device
        decoder = cls.empty_decoder(loaded, settings, rows)
        embed = talker.model.embed_tokens
        width = int(loaded.thinker.get_input_embeddings().weight.shape[1])
        code = torch.zeros((1,), dtype=torch.long, device=device)
        part = torch.zeros((width,), dtype=embed.weight.dtype, device=device)
        positions = torch.zeros((3, 1), dtype=torch.long, device=device)
        decoder.inputs = (code, part, positions)
        decoder.bind(lambda: cls.forward(loaded, decoder, (embed(code) + part)[None], positions))
        return decoder

    def _reply_part(self, s: int):
        if s < len(self.vecs):
            return self.vecs[s]
        if not self.ended:
            return None
        return self.text_eos if s == len(self.vecs) else self.text_pad

    def _input_ready(self) -> bool:
        return self._reply_part(self.steps) is not None

    def _forward_next(self) -> None:
        part = self._reply_part(self.steps)
        pos = self.pos
        self.pos += 1

        def fill(code, static_part, positions) -> None:
            code.fill_(self.last_code)
            static_part.copy_(part)
            positions.fill_(pos)

        self.logits = self._step_with(fill)

    def _seen_codes(self) -> list[int]:
        return sorted(set(self.history[0].tolist()))

    def _part_after_frame(self, ahead: int = 0) -> Any:
        return self._reply_part(self.steps + 1 + ahead)

    def _append_frame(self, values: list[int]) -> bool:
        code = values[0]
        if code in self.eos:
            return True
        self.last_code = code
        self.frames.append(code)
        return False

    def _take_frame(self) -> bool:
        import torch

        code = self.sampler(self.logits, self.history)
        if code in self.eos:
            return True
        self.history = torch.cat([self.history, torch.tensor([[code]])], dim=1)
        self.last_code = code
        self.frames.append(code)
        return False
