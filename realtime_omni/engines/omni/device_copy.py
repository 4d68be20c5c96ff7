"""Host tensors to the device without making the host wait for the device's queue."""

from __future__ import annotations

from typing import Any


def to_device(host: Any, device: Any) -> Any:
    """A host tensor on ``device`` without waiting for the stream: pageable memory would make
    the host wait until the stream reaches the copy; pinned memory lets it queue (CUDA only)."""
    if getattr(device, "type", str(device)) != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
