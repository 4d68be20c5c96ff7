"""How each model is built, by name: the registered builders and ``omni:<checkpoint dir>``.

A leaf of the engines package (it imports only :mod:`.base` at module level): both the
:class:`~.registry.ModelRegistry` in the server and the worker process (:mod:`.worker.process`),
which builds its model itself, resolve names here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from .base import VoiceModel


def _embedded() -> VoiceModel:
    try:
        from .embedded import EmbeddedModel
    except ImportError as exc:  # the GPL extra is optional
        raise RuntimeError(
            "the embedded models need the optional extra: pip install 'realtime-omni[embedded]'"
        ) from exc
    return EmbeddedModel()


def _echo() -> VoiceModel:
    from .echo import EchoModel

    return EchoModel()


def _omni(spec: str) -> VoiceModel:
    """``omni:/path/to/checkpoint`` (Qwen2.5-Omni or Qwen3-Omni, detected from config.json),
    configured by ``REALTIME_OMNI_OMNI_*`` variables (:class:`~.omni.settings.OmniSettings`)."""
    try:
        from .omni import OmniModel
        from .omni.settings import OmniSettings
    except ImportError as exc:
        raise RuntimeError("the omni engine needs the optional extra: pip install 'realtime-omni[omni]'") from exc
    return OmniModel(spec, **OmniSettings().model_kwargs())


BUILDERS: dict[str, Callable[[], VoiceModel]] = {"embedded": _embedded, "echo": _echo}


def _silero_vad() -> object:
    from .embedded.vad_silero import SileroVAD

    return SileroVAD()


#: VADs that a gateway runs itself beside the audio when the model's workers are remote (Ray
#: placement): a factory of an object whose ``stream()`` is the engine's own ``VADStream``
GATEWAY_VADS: dict[str, Callable[[], object]] = {"embedded": _silero_vad}


def resolve_builder(name: str, extra: dict[str, Callable[[], VoiceModel]] | None = None) -> Callable[[], VoiceModel]:
    """The builder for a model name: a registered one, or ``omni:<checkpoint dir>``."""
    builders = {**BUILDERS, **(extra or {})}
    if name in builders:
        return builders[name]
    if name.startswith("omni:"):
        return functools.partial(_omni, name.removeprefix("omni:"))
    raise ValueError(f"unknown model {name!r}; choose from {sorted(builders)} or omni:<checkpoint dir>")
