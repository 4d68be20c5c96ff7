"""Which models a server offers, by id, and how each is built."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from .base import ModelInfo, VoiceModel
from .builders import BUILDERS, resolve_builder

__all__ = ["BUILDERS", "ModelRegistry", "resolve_builder"]

log = logging.getLogger(__name__)


@dataclass
class ModelRegistry:
    """Loaded models; the first is the default for ``/v1/realtime`` without ``?model=``."""

    models: dict[str, VoiceModel] = field(default_factory=dict)
    default: str | None = None

    def add(self, model: VoiceModel) -> None:
        self.models[model.info.id] = model
        if self.default is None:
            self.default = model.info.id

    def load(
        self,
        names: list[str],
        extra: dict[str, Callable[[], VoiceModel]] | None = None,
        isolate: bool | Collection[str] = False,
    ) -> None:
        """Build and load models by name. Isolated models run in a supervised worker process
        (a crash there fails the affected responses; the worker restarts); ``echo`` never needs it."""
        for name in names:
            builder = resolve_builder(name, extra)
            if name != "echo" and (isolate is True or (not isinstance(isolate, bool) and name in isolate)):
                from .worker import IsolatedModel

                # the child resolves registered and omni: names itself; others travel pickled
                own = builder is BUILDERS.get(name) or name.startswith("omni:")
                model: VoiceModel = IsolatedModel(name, builder=None if own else builder)
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

    def get(self, name: str | None) -> VoiceModel | None:
        return self.models.get(name or self.default or "")

    def close(self) -> None:
        for model in self.models.values():
            model.close()
