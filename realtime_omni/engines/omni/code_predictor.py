"""Qwen3-Omni's code predictor: the residual codebooks of each codec frame, as one CUDA graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .code_predictor_lean import LeanFrames, supports
from .graphs import StepGraph
from .streams import on_stream, same_device
from .loader import LoadedOmni
from .sampling import sample_top_k_top_p


@dataclass(frozen=True)
class CodePredictorSpec:
    """The code predictor's sampling: ``groups`` codebooks per frame, top-k of ``temperature``."""

    groups: int
    temperature: float
    top_k: int

    @classmethod
    def of(cls, loaded: LoadedOmni) -> CodePredictorSpec:
        cp = loaded.talker.code_predictor
        gc = getattr(cp, "generation_config", None)
        vocab = int(cp.lm_head[0].weight.shape[0])
        return cls(groups=int(loaded.config.talker_config.num_code_groups),
                   temperature=float(getattr(gc, "temperature", None) or 1.0), top_k=min(50, vocab))


class CodeFrames:
    """Qwen3's residual codebooks of one frame: the code predictor's ``G - 1`` steps (prefill of
    [talker hidden, embed(c0)], then one step per codebook, each sampled) as one replayed graph.

    Sampling happens inside the graph (temperature → top-k → top-p, then an exponential race,
    which draws from the same distribution as a multinomial); the uniform draws come from the
    session's generator before each frame, so runs stay reproducible per seed.
    """

    def __init__(self, loaded: LoadedOmni, *, do_sample: bool = True, cuda_graphs: bool = True,
                 generator: Any = None) -> None:
        import torch

        talker = loaded.talker
        device = loaded.device
        spec = CodePredictorSpec.of(loaded)
        self.groups = groups = spec.groups
        self.generator = generator if generator is not None and same_device(generator.device, device) else None
        self.top_k = top_k = spec.top_k
        self.device = device
        self.stream = loaded.stream("talker")
        width = int(loaded.config.talker_config.text_config.hidden_size)
        dtype = talker.codec_head.weight.dtype
        self.hidden = torch.zeros((1, width), dtype=dtype, device=device)
        self.c0 = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.noise = torch.full((1, max(1, groups - 1), top_k), 0.5, dtype=torch.float32, device=device)
        step = frame_step(loaded, do_sample)(1, None, (self.hidden, self.c0, self.noise))
        self.graph = StepGraph(step, device=device, enabled=cuda_graphs, name=f"{loaded.arch} code predictor frame",
                               **loaded.graph_streams("talker"))

    def __call__(self, hidden, c0: int) -> tuple[list[int], Any]:
        """Codebooks 1..G-1 of the frame whose codebook 0 is ``c0``; and the frame's embedding."""
        with on_stream(self.stream):
            self.hidden.copy_(hidden.reshape(self.hidden.shape))
            self.c0.fill_(c0)
            self.noise.uniform_(generator=self.generator)
            codes, embed = self.graph()
            embed = embed[0].clone()
        return codes[0].tolist(), embed

    def release(self) -> None:
        self.graph.release()


def frame_step(loaded: LoadedOmni, do_sample: bool, lean: bool | None = None):
    """``make(bucket, _, (hidden, c0, noise))`` → a step computing ``bucket`` frames' residual
    codebooks at once: ``hidden`` (bucket, H) talker states, ``c0`` (bucket, 1) codebook-0
    codes, ``noise`` (bucket, G-1, k) uniform draws; returns codes (bucket, G-1) and the frames'
    summed codebook embeddings (bucket, H). The cache is rebuilt every frame. ``lean`` (None:
    as the model's settings say, wherever the code predictor's layout allows it) runs the frame as
    :class:`~.code_predictor_lean.LeanFrames` lays it out, in far fewer kernels; otherwise
    through transformers' modules."""
    from transformers.cache_utils import StaticCache

    talker = loaded.talker
    cp = talker.code_predictor
    spec = CodePredictorSpec.of(loaded)
    groups = spec.groups
    if lean is None:
        lean = loaded.lean_code_predictor and supports(cp)
    if lean:
        frames = LeanFrames.of(loaded)
        return lambda bucket, _write_pos, inputs: frames.step(bucket, do_sample, spec, inputs)

    def make(bucket: int, write_pos: Any, inputs: tuple[Any, ...]):
        import torch

        hidden, c0, noise = inputs
        cache = StaticCache(config=cp.model.config, max_cache_len=groups + 1)
        # the prefill's causal mask over the whole static cache, built once: left to transformers,
        # a two-token query reads the cache length on the host to decide whether it can skip it
        prefill_mask = torch.ones((2, groups + 1), dtype=torch.bool, device=loaded.device).tril()[None, None]

        def step():
            for layer in cache.layers:  # a fresh prefix every frame
                layer.cumulative_length.zero_()
            first = talker.model.codec_embedding(c0)  # (bucket, 1, H)
            embeds = [first]
            x = torch.cat([hidden[:, None, :].to(first.dtype), first], dim=1)
            codes = []
            for j in range(1, groups):
                out = cp.model(inputs_embeds=x, use_cache=True, return_dict=True,
                               attention_mask=prefill_mask if j == 1 else None, **{loaded.cache_kwarg: cache})
                logits = cp.lm_head[j - 1](out.last_hidden_state[:, -1, :]).float()
                if do_sample:
                    code = sample_top_k_top_p(logits, noise[:, j - 1], spec.temperature, spec.top_k, 0.8)
                else:
                    code = torch.argmax(logits, dim=-1, keepdim=True)
                codes.append(code)
                x = cp.model.codec_embedding[j - 1](code)
                embeds.append(x)
            return torch.cat(codes, dim=1), torch.cat(embeds, dim=1).sum(dim=1)

        return step

    return make
