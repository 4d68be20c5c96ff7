"""What the talker reads of the thinker, per token (hidden states selected, how they combine).

The per-session thinker forward and the batched prefill both build the talker's vectors with
:class:`TalkerReads`, so the two paths cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .loader import LoadedOmni


@dataclass(frozen=True)
class TalkerReads:
    """Which thinker hidden states the talker needs per token, and how they combine (see the
    :mod:`.thinker` module doc): the single-session forward and the batched prefill both use this."""

    arch: str
    accept_layer: int
    audio: int
    image: int | None
    #: ``output_hidden_states``: indices (transformers >= 5.2x selects), or True (all of them)
    select: Any

    @classmethod
    def of(cls, loaded: LoadedOmni) -> TalkerReads:
        qwen25 = loaded.arch == "qwen2_5_omni"
        accept = -1 if qwen25 else int(getattr(loaded.config.talker_config, "accept_hidden_layer", -1))
        try:
            from transformers.utils.output_capturing import selected_hidden_states  # noqa: F401

            select: Any = [0] if qwen25 else [0, accept]
        except ImportError:
            select = True
        return cls(loaded.arch, accept, loaded.tokens.audio, loaded.tokens.image, select)

    def vectors(self, ids, hidden_states, last):
        """Per token ``(B, T, H)``: Qwen2.5 ``last + embedding`` (embedding 0 at audio/image
        tokens); Qwen3 the embedding, or the layer-``accept_layer`` state at audio/image tokens."""
        import torch

        multimodal = ids == self.audio
        if self.image is not None:
            multimodal |= ids == self.image
        embed = hidden_states[0]
        if self.arch == "qwen2_5_omni":
            return last + torch.where(multimodal[..., None], torch.zeros_like(embed), embed)
        return torch.where(multimodal[..., None], hidden_states[self.accept_layer], embed)
