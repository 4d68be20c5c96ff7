"""Qwen3-Omni's code predictor: the residual codebooks of each codec frame, as one CUDA graph."""

from __future__ import annotations

from typing import Any

from .graphs import StaticDecoder, StepGraph, on_stream, same_device
from .loader import LoadedOmni


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
        cp = talker.code_predictor
        device = loaded.device
        self.groups = groups = int(loaded.config.talker_config.num_code_groups)
        self.generator = generator if generator is not None and same_device(generator.device, device) else None
        self.decoder = StaticDecoder(cp.model.config, groups + 1, device, graphs=False, name="code predictor")
        gc = getattr(cp, "generation_config", None)
        temperature = float(getattr(gc, "temperature", None) or 1.0)
        vocab = int(cp.lm_head[0].weight.shape[0])
        self.top_k = top_k = min(50, vocab)
        do_sample = bool(do_sample)
        width = int(loaded.config.talker_config.text_config.hidden_size)
        dtype = talker.codec_head.weight.dtype
        self.hidden = torch.zeros((1, 1, width), dtype=dtype, device=device)
        self.c0 = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.noise = torch.full((max(1, groups - 1), top_k), 0.5, dtype=torch.float32, device=device)
        cache = self.decoder.cache
        self.stream = loaded.stream("talker")
        # the prefill's causal mask over the whole static cache, built once: left to transformers,
        # a two-token query reads the cache length on the host to decide whether it can skip it
        prefill_mask = torch.ones((2, groups + 1), dtype=torch.bool, device=device).tril()[None, None]

        def frame():
            for layer in cache.layers:  # a fresh prefix every frame
                layer.cumulative_length.zero_()
            first = talker.model.codec_embedding(self.c0)  # (1, 1, H)
            embeds = [first]
            inputs = torch.cat([self.hidden.to(first.dtype), first], dim=1)
            codes = []
            for j in range(1, groups):
                out = cp.model(inputs_embeds=inputs, use_cache=True, return_dict=True,
                               attention_mask=prefill_mask if j == 1 else None, **{loaded.cache_kwarg: cache})
                logits = cp.lm_head[j - 1](out.last_hidden_state[:, -1, :]).float()
                if do_sample:
                    code = sample_top_k_top_p(logits[0], self.noise[j - 1], temperature, top_k, 0.8)
                else:
                    code = torch.argmax(logits[0], dim=-1, keepdim=True)
                codes.append(code)
                inputs = cp.model.codec_embedding[j - 1](code.view(1, 1))
                embeds.append(inputs)
            return torch.cat(codes), torch.cat(embeds, dim=1).sum(dim=1)[0]

        self.graph = StepGraph(frame, device=device, enabled=cuda_graphs,
                               name=f"{loaded.arch} code predictor frame",
                               **loaded.graph_streams("talker"))

    def __call__(self, hidden, c0: int) -> tuple[list[int], Any]:
        """Codebooks 1..G-1 of the frame whose codebook 0 is ``c0``; and the frame's embedding."""
        with on_stream(self.stream):
            self.hidden.copy_(hidden)
            self.c0.fill_(c0)
            self.noise.uniform_(generator=self.generator)
            codes, embed = self.graph()
            embed = embed.clone()
        return codes.tolist(), embed


def sample_top_k_top_p(logits, uniform, temperature: float, top_k: int, top_p: float):
    """One draw from ``softmax(logits / temperature)`` cut to the top-k, then to the top-p mass;
    ``uniform`` (k values in (0, 1)) drives an exponential race. No host sync: graph-safe."""
    import torch

    values, index = torch.topk(logits / temperature, top_k)  # sorted, largest first
    probs = torch.softmax(values, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    probs = probs * (before < top_p)  # the smallest prefix whose mass reaches top_p
    race = probs / -torch.log(uniform.clamp_min(1e-20))
    return index.gather(-1, torch.argmax(race, dim=-1, keepdim=True))
