"""WebRTC transport (OpenAI Realtime GA flow) on aiortc.

One module per piece: :mod:`.calls` (HTTP signalling, call registry), :mod:`.offer` (the offer's body), :mod:`.peer` (one call's
RTCPeerConnection ⇄ session runner), :mod:`.tracks` (incoming microphone, outgoing paced track),
:mod:`.video` (camera sampling), :mod:`.ice` (ICE servers, candidate addresses).
"""

from .calls import CallRegistry, registry, router, shutdown
from .peer import Peer, WebRTCOptions

__all__ = ["CallRegistry", "Peer", "WebRTCOptions", "registry", "router", "shutdown"]
