"""Which models a server offers, by id, and how each is built."""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from .base import ModelInfo, VoiceModel
from .builders import BUILDERS, GATEWAY_VADS, is_builtin, resolve_builder
from .settings import EngineSettings

__all__ = ["BUILDERS", "ModelRegistry", "resolve_builder"]

log = logging.getLogger(__name__)


#: an alias target meaning "the registry's default model"
DEFAULT_TARGET = "default"
#: model ids the official clients and agent frameworks send by default (pipecat and LiveKit ask
#: for ``gpt-realtime``; older code for ``gpt-4o-realtime-preview-2024-12-17``): glob → served id
OPENAI_MODEL_ALIASES: dict[str, str] = {
    "gpt-realtime*": DEFAULT_TARGET,
    "gpt-4o-realtime-preview*": DEFAULT_TARGET,
    "gpt-4o-mini-realtime-preview*": DEFAULT_TARGET,
}


@dataclass
class ModelRegistry:
    """Loaded models; the first is the default for ``/v1/realtime`` without ``?model=``."""

    models: dict[str, VoiceModel] = field(default_factory=dict)
    default: str | None = None
    #: glob patterns of requested ids → the served id they mean (``"default"``: the default)
    aliases: dict[str, str] = field(default_factory=lambda: dict(OPENAI_MODEL_ALIASES))

    def add(self, model: VoiceModel) -> None:
        self.models[model.info.id] = model
        if self.default is None:
            self.default = model.info.id

    def load(
        self,
        names: list[str],
        extra: dict[str, Callable[[], VoiceModel]] | None = None,
        isolate: bool | Collection[str] = False,
        ray_address: str | None = None,
        engines: EngineSettings | None = None,
    ) -> None:
        """Build and load models by name, built-in ones with their section of ``engines``.
        Isolated models run in a supervised worker process (a crash there fails the affected
        responses; the worker restarts); ``echo`` never needs it. With ``ray_address`` every model
        runs as worker actors on that Ray cluster instead (:mod:`.placement`), ``isolate`` then
        does not apply. Workers and actors are handed ``engines`` with their arguments."""
        engines = engines if engines is not None else EngineSettings()
        for name in names:
            builder = resolve_builder(name, extra, engines)
            own = is_builtin(name) and not (extra and name in extra)
            if ray_address:
                from .placement import RayModel

                model: VoiceModel = RayModel(name, ray_address, builder=None if own else builder, engines=engines,
                                             gateway_vad=GATEWAY_VADS.get(name))
            elif name != "echo" and (isolate is True or (not isinstance(isolate, bool) and name in isolate)):
                from .worker import IsolatedModel

                # the child resolves registered and omni: names itself; others travel pickled
                model = IsolatedModel(name, builder=None if own else builder, engines=engines)
            else:
                model = builder()
            started = time.monotonic()
            model.load(lambda msg, n=name: log.info("[%s] %s", n, msg))
            log.info("model %s ready in %.1f s", model.info.id, time.monotonic() - started)
            self.add(model)

    def not_ready(self) -> list[str]:
        """Models whose worker is down or restarting (in-process models are always ready)."""
        return [m.info.id for m in self.models.values() if not getattr(m, "ready", True)]

    def stats(self) -> dict[str, dict[str, dict[str, float]]]:
        """Every model's engine counters (blocking: a worker round trip; call off the loop)."""
        return {m.info.id: m.stats() for m in self.models.values()}

    def infos(self) -> list[ModelInfo]:
        return [m.info for m in self.models.values()]

    def resolve(self, name: str | None) -> str | None:
        """The served model id a requested one means: itself, an alias's target, the default
        when none is asked for; None when nothing serves it."""
        if not name:
            return self.default
        if name in self.models:
            return name
        for pattern, target in self.aliases.items():
            if fnmatch.fnmatchcase(name, pattern):
                served = self.default if target == DEFAULT_TARGET else target
                return served if served in self.models else None
        return None

    def aliases_of(self, model_id: str) -> list[str]:
        """The alias patterns that resolve to ``model_id``."""
        return [p for p, t in self.aliases.items() if (self.default if t == DEFAULT_TARGET else t) == model_id]

    def check_aliases(self) -> None:
        """Every alias must point at a served model (a typo in the settings fails at startup)."""
        for pattern, target in self.aliases.items():
            if target != DEFAULT_TARGET and target not in self.models:
                raise ValueError(f"model alias {pattern!r} points at {target!r}, which is not served "
                                 f"(served: {', '.join(self.models)})")

    def get(self, name: str | None) -> VoiceModel | None:
        served = self.resolve(name)
        return self.models.get(served) if served else None

    def close(self) -> None:
        for model in self.models.values():
            model.close()
