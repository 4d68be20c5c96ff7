"""The codecs' waveform models as the streaming codec runs them: Qwen2.5-Omni's token2wav (a
flow-matching DiT sampled with a fixed ODE, then the BigVGAN vocoder) and Qwen3-Omni's code2wav.

Each function is the transformers module's forward with what a CUDA graph cannot hold taken out
(host syncs, tensors built from host values) and with inputs that windows share passed in (the
ODE's start noise, a speaker's encoding), so that a window of several sessions runs as one batch.
"""

from __future__ import annotations

import math

from .dit_blocks import DiTWindow, run_blocks
from .graphs import piece_boundary
from .vocoder_kernels import activation, amp_block


def dit_sample(dit, conditioning, reference_mel, codes, noise, num_steps=10, guidance_scale=0.5,
               sway_coefficient=-1.0, speaker_encoding=None, lengths=None):
    """``Qwen2_5OmniToken2WavDiTModel.sample`` with the initial noise passed in (same ODE, same
    classifier-free guidance, same sway schedule) so that windows share one noise field.

    The reference recomputes the ECAPA speaker encoder on the reference mel in each of its 36 DiT
    evaluations; it depends only on the speaker, so it is computed once (``speaker_encoding``,
    from :func:`encode_speaker`) and the DiT forward is replayed around it.

    ``codes`` (windows, n) and ``noise`` (windows, 2n, mel) hold one row per window; the speaker
    is either one for all windows (``conditioning`` (1, D), an encoding (branches, D')) or one per
    window ((windows, D) and (windows, branches, D')). ``lengths`` (windows,): each window's own
    length in codes where windows of different lengths are padded at their ends to ``n`` (see
    :class:`~.dit_blocks.DiTWindow`); a window's mel frames up to its length come out as alone.
    """
    import torch

    duration = codes.shape[1] * dit.repeats
    if noise.shape[1] != duration:
        raise ValueError(f"noise covers {noise.shape[1]} mel frames, codes need {duration}")
    cfg = guidance_scale >= 1e-5
    if speaker_encoding is None:
        speaker_encoding = encode_speaker(dit, reference_mel, cfg)
    batch = codes.shape[0]  # windows of several sessions decode together
    if speaker_encoding.ndim == 2:  # one speaker for the batch: (branches, D')
        speaker_encoding = speaker_encoding[None].expand(batch, -1, -1)
    cond = conditioning.expand(batch, -1).unsqueeze(1).repeat(1, duration, 1)
    code_embed = dit.text_embed(codes, drop_code=False)
    if cfg:
        code_embed = torch.cat([code_embed, dit.text_embed(codes, drop_code=True)], dim=0)
        speaker = torch.cat([cond, torch.zeros_like(cond)], dim=0)
    else:
        speaker = cond
    # per window a row per guidance branch ([reference, silence]); the DiT's batch is every
    # window's first branch, then every window's second
    spk_seq = speaker_encoding.transpose(0, 1).reshape(-1, speaker_encoding.shape[-1])
    spk_seq = spk_seq.unsqueeze(1).repeat(1, duration, 1)
    if lengths is not None:  # in mel frames, for every row of the DiT's batch
        lengths = lengths * dit.repeats
        lengths = torch.cat([lengths, lengths]) if cfg else lengths
    window = DiTWindow(dit, duration, codes.device, dit.proj_out.weight.dtype, lengths)
    static = (spk_seq, code_embed, speaker, window)

    def ode_function(time_step, hidden_states):
        piece_boundary()  # one graph per evaluation when captured in pieces (graphs.py)
        out = _dit_forward(dit, hidden_states, time_step, static, cfg)
        if not cfg:
            return out
        guided, null = torch.chunk(out, 2, dim=0)
        return guided + (guided - null) * guidance_scale

    t = torch.linspace(0, 1, num_steps, device=codes.device, dtype=cond.dtype)
    if sway_coefficient is not None:
        t = t + sway_coefficient * (torch.cos(torch.pi / 2 * t) - 1 + t)
    # the reference RungeKutta4ODESolver's steps, in its order of operations, keeping only the
    # end point: its interpolation bookkeeping compares time tensors on the host (a sync)
    value = noise.to(cond.dtype)
    third = 1 / 3
    for i in range(num_steps - 1):
        t0, t1 = t[i], t[i + 1]
        dt = t1 - t0
        k1 = ode_function(t0, value)
        k2 = ode_function(t0 + dt * third, value + dt * k1 * third)
        k3 = ode_function(t0 + dt * (2 / 3), value + dt * (k2 - k1 * third))
        k4 = ode_function(t1, value + dt * (k1 - k2 + k3))
        value = value + (k1 + 3 * (k2 + k3) + k4) * dt / 8
    return value.permute(0, 2, 1)


def code2wav(c2w, codes):
    """``Qwen3OmniMoeCode2Wav.forward`` with its sliding-window causal mask built here: left to
    transformers, the mask is derived by inspecting position ids on the host (a sync that a
    CUDA graph cannot hold)."""
    import torch

    hidden = c2w.code_embedding(codes + c2w.code_offset).mean(1)
    n = hidden.shape[1]
    i = torch.arange(n, device=hidden.device)
    back = i[:, None] - i[None, :]  # query - key
    window = getattr(c2w.pre_transformer.config, "sliding_window", None) or n
    mask = ((back >= 0) & (back < window))[None, None]
    hidden = c2w.pre_transformer(inputs_embeds=hidden, attention_mask={"sliding_attention": mask}).last_hidden_state
    hidden = hidden.permute(0, 2, 1)
    for blocks in c2w.upsample:
        piece_boundary()  # one graph per stage when captured in pieces (graphs.py)
        for block in blocks:
            hidden = block(hidden)
    wav = hidden
    for block in c2w.decoder:
        piece_boundary()
        wav = block(wav)
    return wav.clamp(min=-1, max=1)


def vocode(vocoder, mel, fused: bool = True):
    """``Qwen2_5OmniToken2WavBigVGANModel.forward`` without its final copy to the CPU (a sync a
    CUDA graph cannot hold), with the dB floor as a plain number (no tensor built inside) and,
    on the GPU, its anti-aliased activations as fused kernels (:mod:`.vocoder_kernels`;
    ``fused=False``: transformers' modules throughout)."""
    import torch

    floor = math.exp(-115 / 20.0 * math.log(10))
    db = 20 * torch.log10(torch.clamp(torch.exp(mel), min=floor)) - 20
    x = vocoder.normalize_spectrogram(db, 1, -115)
    x = vocoder.conv_pre(x)
    blocks = vocoder.num_residual_blocks
    for i in range(vocoder.num_upsample_layers):
        piece_boundary()
        x = vocoder.ups[i][0](x)
        x = sum(amp_block(vocoder.resblocks[i * blocks + b], x, fused) for b in range(blocks)) / blocks
    x = activation(vocoder.activation_post, x) if fused else vocoder.activation_post(x)
    x = vocoder.conv_post(x)
    return torch.clamp(x, min=-1.0, max=1.0).squeeze(1)  # (windows, samples)


def encode_speaker(dit, reference_mel, cfg: bool = True):
    """The DiT's ECAPA encoding of the reference mel ([reference, silence] with guidance)."""
    import torch

    mel = torch.cat([reference_mel, torch.zeros_like(reference_mel)], dim=0) if cfg else reference_mel
    return dit.input_embed.spk_encoder(mel)


def set_dit_dtype(dit, dtype: str) -> None:
    """Run the DiT's transformer (its input projection, blocks and output head) in ``dtype``.

    The rest stays float32: the speaker encoder and code embedding (computed once per speaker or
    window), the time embedding (tiny) and the ODE itself, whose state and guidance arithmetic
    :func:`_dit_forward` keeps in float32 around each evaluation. The transformer is where a
    window's time goes (36 evaluations of every layer), and in bfloat16 each moves half the bytes."""
    import torch

    target = getattr(torch, dtype)
    for module in (dit.input_embed.proj, dit.transformer_blocks, dit.norm_out, dit.proj_out):
        module.to(target)


def _dit_forward(dit, hidden_states, time_step, static, cfg: bool):
    """``Qwen2_5OmniToken2WavDiTModel.forward`` (and ``DiTInputEmbedding.forward``) with the
    speaker encoding and code embeddings precomputed, the transformer in its own precision
    (:func:`set_dit_dtype`) and the velocity returned in float32."""
    import torch

    spk_seq, code_embed, speaker, window = static
    dtype = dit.proj_out.weight.dtype
    batch = hidden_states.shape[0] * (2 if cfg else 1)
    if time_step.ndim == 0:
        time_step = time_step.repeat(batch)
    time_embedding = dit.time_embed(time_step).to(dtype)
    if cfg:
        hidden_states = torch.cat([hidden_states, hidden_states], dim=0)
    hidden = dit.input_embed.proj(torch.cat((hidden_states, spk_seq, code_embed, speaker), dim=-1).to(dtype))
    hidden = run_blocks(dit, hidden, time_embedding, window)
    hidden = dit.norm_out(hidden, time_embedding)
    return dit.proj_out(hidden).float()
