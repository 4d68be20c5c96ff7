"""The one shape audio has inside the server: int16 mono samples with their sample rate."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class Pcm:
    """A piece of mono audio. Transports build it at their edge (decoding wire formats there);
    everything between the edges passes it along and resamples it where a consumer needs
    another rate. eq=False: it holds an array, and it is a message, never compared."""

    samples: np.ndarray
    rate: int

    @property
    def duration_ms(self) -> float:
        return 1000.0 * len(self.samples) / self.rate

    @property
    def nbytes(self) -> int:
        return int(self.samples.nbytes)

    def __len__(self) -> int:
        return len(self.samples)
