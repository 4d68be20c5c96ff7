"""WebRTC transport (OpenAI Realtime GA flow) on aiortc.

One module per piece: :mod:`.calls` (HTTP signalling, call registry), :mod:`.offer` (the offer's body), :mod:`.peer` (one call's
RTCPeerConnection ⇄ session runner), :mod:`.incoming` (the microphone), :mod:`.tracks` (the outgoing paced track), :mod:`.pacing` (its
clock, rates and packet length), :mod:`.opus` (its encoder), :mod:`.avatar` (the outgoing video),
:mod:`.video` (camera sampling), :mod:`.ice` (ICE servers, candidate addresses).
"""

from .calls import CallRegistry, registry, router, shutdown
from .peer import Peer, WebRTCOptions

__all__ = ["CallRegistry", "Peer", "WebRTCOptions", "registry", "router", "shutdown"]
