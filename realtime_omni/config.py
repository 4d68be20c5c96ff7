"""Server settings: command-line flags override ``REALTIME_OMNI_*`` environment variables."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .engines.registry import OPENAI_MODEL_ALIASES


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REALTIME_OMNI_")

    host: str = "127.0.0.1"
    port: int = 8000
    #: models to load; the first is the default for /v1/realtime without ?model=
    models: list[str] = Field(default_factory=lambda: ["embedded", "echo"])
    #: requested model ids (glob patterns) → the served model they mean; "default" is the first
    #: of ``models``. JSON in REALTIME_OMNI_MODEL_ALIASES; {} turns the OpenAI ids off.
    model_aliases: dict[str, str] = Field(default_factory=lambda: dict(OPENAI_MODEL_ALIASES))
    #: run model engines in a supervised worker process (a crash fails responses, not the server)
    isolate_models: bool = True
    #: place model workers on this Ray cluster (``auto``, ``host:port``, ``ray://host:port``)
    #: instead of a local worker process; None: local (the default). Needs the ``ray`` extra.
    ray_address: str | None = None
    max_sessions: int = 100
    idle_timeout_s: float = 600.0
    max_session_s: float = 3600.0
    #: a session.expiring warning goes out this long before max_session_s closes a session
    expiry_warning_s: float = 60.0
    max_event_bytes: int = 15 * 1024 * 1024
    #: per session: conversation items and instructions together (past it: session_memory_exceeded)
    max_session_bytes: int = 64 * 1024 * 1024
    #: per session: the resume journal (the oldest events leave first; a resume then reports a gap)
    journal_bytes: int = 16 * 1024 * 1024
    #: per session: client frames waiting to be processed, and events waiting to be sent, each
    queue_bytes: int = 32 * 1024 * 1024
    #: audio is sent at most this far ahead of real time (ms); negative disables pacing
    output_lead_ms: float = 1500.0
    model_threads: int = 4
    log_level: str = "info"
    #: folder of the browser demo served at /
    web_dir: str | None = None
    #: API keys accepted as ``Authorization: Bearer``; empty: no authentication
    api_keys: list[str] = Field(default_factory=list)
    #: browser Origins allowed to open sessions (None: any); non-browser clients send none
    allowed_origins: list[str] | None = None
    #: serve GET /metrics without a key even when api_keys are set (e.g. a scraper on a private network)
    metrics_public: bool = False
    #: lifetime of ephemeral client secrets (POST /v1/realtime/client_secrets)
    client_secret_ttl_s: float = 60.0
    #: client events per second per session (excess events are answered with an error)
    max_events_per_s: float = 500.0
    #: a dropped session stays resumable this long (0 disables resume)
    resume_grace_s: float = 30.0
    #: where sessions persist: sqlite:///path.db, redis://host:port/0, or none
    session_store: str = "sqlite:///realtime_omni_sessions.db"
    #: how long a stored session can be resumed after its last change (e.g. across a restart)
    persist_ttl_s: float = 3600.0
    #: store what was said (texts, transcripts); off: stored items keep only their shape
    store_transcripts: bool = True
    #: SIGTERM to exit, at most: half for connections to finish, half to close sessions and the store
    shutdown_timeout_s: float = 10.0
    # --- WebRTC (/v1/realtime/calls) ---
    #: STUN/TURN servers as RTCIceServer dicts (JSON in REALTIME_OMNI_ICE_SERVERS); empty: host
    #: candidates only, nothing outside the machine is contacted. Also handed to browsers.
    ice_servers: list[dict[str, Any]] = Field(default_factory=list)
    #: local addresses for host candidates; empty: 127.0.0.1 when bound to loopback, else all
    webrtc_ice_addresses: list[str] = Field(default_factory=list)
    #: frames aiortc's receive jitter buffer holds before decoding (aiortc's own default: 4)
    webrtc_jitter_prefetch: int = 1
    #: camera frames sampled per second for models with image_in
    webrtc_video_fps: float = 1.0
    webrtc_datachannel_timeout_s: float = 5.0
    webrtc_connect_timeout_s: float = 15.0
    #: hang up when the peer sends neither media nor events for this long (0: never)
    webrtc_peer_timeout_s: float = 10.0
    #: bound of the outgoing audio queued on a call's track
    webrtc_max_queue_ms: float = 5000.0
