"""The server's settings: one tree of sections, built once where the server starts.

Nothing here reads the environment or a file: :func:`~.config_sources.load_settings` merges CLI
flags > ``REALTIME_OMNI_*`` variables > a config file > these defaults, and the result is handed
down explicitly (the app, the transports, the engines; workers and Ray actors get their
``engines`` section with their arguments).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from .engines.registry import OPENAI_MODEL_ALIASES
from .engines.settings import EmbeddedSettings, EngineSettings, OmniSettings

__all__ = ["EmbeddedSettings", "EngineSettings", "OmniSettings", "ServerSettings"]


class _Section(BaseModel):
    # a misspelt key is an error, not a silently ignored setting
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerSection(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: str = "info"
    #: folder of the browser demo served at /
    web_dir: str | None = None
    #: SIGTERM to exit, at most: half for connections to finish, half to close sessions and the store
    shutdown_timeout_s: float = Field(default=10.0, gt=0)


class ServingSection(_Section):
    """Which models are served, and where they run."""

    #: models to load; the first is the default for /v1/realtime without ?model=
    models: list[str] = Field(default_factory=lambda: ["embedded", "echo"])
    #: requested model ids (glob patterns) → the served model they mean; "default" is the first
    #: of ``models``. {} turns the OpenAI ids off.
    aliases: dict[str, str] = Field(default_factory=lambda: dict(OPENAI_MODEL_ALIASES))
    #: run model engines in a supervised worker process (a crash fails responses, not the server)
    isolate: bool = True
    #: place model workers on this Ray cluster (``auto``, ``host:port``, ``ray://host:port``)
    #: instead of a local worker process; None: local (the default). Needs the ``ray`` extra.
    ray_address: str | None = None
    #: threads that run the sessions' model stages in this process
    threads: int = Field(default=4, ge=1)
    #: ``semantic_vad`` asks an end-of-turn model (Smart Turn v3.2, fetched at the first start
    #: into ``engines.embedded.cache_dir``) whether a pause ends the user's turn; False: it is a
    #: silence window set by its eagerness
    end_of_turn_model: bool = True


class LimitsSection(_Section):
    max_sessions: int = Field(default=100, ge=1)
    idle_timeout_s: float = Field(default=600.0, gt=0)
    max_session_s: float = Field(default=3600.0, gt=0)
    #: a session.expiring warning goes out this long before max_session_s closes a session
    expiry_warning_s: float = Field(default=60.0, ge=0)
    max_event_bytes: int = Field(default=15 * 1024 * 1024, ge=1)
    #: per session: conversation items and instructions together (past it: session_memory_exceeded)
    max_session_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    #: per session: the resume journal (the oldest events leave first; a resume then reports a gap)
    journal_bytes: int = Field(default=16 * 1024 * 1024, ge=0)
    #: per session: client frames waiting to be processed, and events waiting to be sent, each
    queue_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    #: client events per second per session (excess events are answered with an error)
    max_events_per_s: float = Field(default=500.0, gt=0)
    #: audio is sent at most this far ahead of real time (ms); negative disables pacing
    output_lead_ms: float = 1500.0


class StoreSection(_Section):
    #: where sessions persist: sqlite:///path.db, redis://host:port/0, or none
    url: str = "sqlite:///realtime_omni_sessions.db"
    #: how long a stored session can be resumed after its last change (e.g. across a restart)
    ttl_s: float = Field(default=3600.0, gt=0)
    #: a dropped session stays resumable this long (0 disables resume)
    resume_grace_s: float = Field(default=30.0, ge=0)
    #: store what was said (texts, transcripts); off: stored items keep only their shape
    transcripts: bool = True
    #: with a store shared by several server processes (Redis): each holds its live sessions
    #: for this long, renewed every fifth of it; a resume through another process takes the
    #: session over (the holder lets go at its next renewal; one that died, after this long)
    lease_s: float = Field(default=5.0, ge=1.0, le=120.0)


class AuthSection(_Section):
    #: API keys accepted as ``Authorization: Bearer``; empty: no authentication. An empty or
    #: blank key is refused: it would match a client presenting no key at all
    api_keys: list[str] = Field(default_factory=list)
    #: browser Origins allowed to open sessions (None: any); non-browser clients send none
    allowed_origins: list[str] | None = None
    #: serve GET /metrics without a key even when api_keys are set (e.g. a scraper on a private network)
    metrics_public: bool = False
    #: lifetime of ephemeral client secrets (POST /v1/realtime/client_secrets)
    client_secret_ttl_s: float = Field(default=60.0, gt=0)

    @field_validator("api_keys")
    @classmethod
    def _keys_not_blank(cls, keys: list[str]) -> list[str]:
        if any(not key.strip() for key in keys):
            raise ValueError("an API key may not be empty or blank")
        return keys


class WebRTCSection(_Section):
    #: STUN/TURN servers as RTCIceServer dicts; empty: host candidates only, nothing outside the
    #: machine is contacted. Also handed to browsers.
    ice_servers: list[dict[str, Any]] = Field(default_factory=list)
    #: local addresses for host candidates; empty: 127.0.0.1 when bound to loopback, else all
    ice_addresses: list[str] = Field(default_factory=list)
    #: frames aiortc's receive jitter buffer holds before decoding (aiortc's own default: 4);
    #: 0 releases each Opus packet on arrival (the decoder fills lost ones with silence). Keep 0
    #: where packets are lost: with 1 and 5 % loss the round trip grew from 74 to 369 ms, aiortc's
    #: buffer holding on after a gap (docs/benchmarks/webrtc-loss.md)
    jitter_prefetch: int = Field(default=0, ge=0)
    #: camera frames sampled per second for models with image_in
    video_fps: float = Field(default=1.0, gt=0)
    #: a caller whose offer asks to receive video gets a face whose mouth follows the reply's audio
    avatar: bool = True
    avatar_width: int = Field(default=320, ge=16, le=1920)
    avatar_height: int = Field(default=240, ge=16, le=1080)
    avatar_fps: float = Field(default=15.0, gt=0, le=60)
    datachannel_timeout_s: float = Field(default=5.0, gt=0)
    connect_timeout_s: float = Field(default=15.0, gt=0)
    #: hang up when the peer sends neither media nor events for this long (0: never)
    peer_timeout_s: float = Field(default=10.0, ge=0)
    #: bound of the outgoing audio queued on a call's track
    max_queue_ms: float = Field(default=5000.0, gt=0)
    #: audio in each outgoing Opus packet: 20, 40 or 60 ms, or "auto": 20 while the server holds
    #: fewer than audio_busy_calls calls, 40 from there. 40 halves the packets (and the CPU of
    #: RTP, SRTP and the sockets) for 20 ms more delay (docs/benchmarks/webrtc-media-path.md)
    audio_packet_ms: int | Literal["auto"] = "auto"
    audio_busy_calls: int = Field(default=32, ge=1)

    @field_validator("audio_packet_ms")
    @classmethod
    def _packet_ms(cls, value: int | str) -> int | str:
        if value not in (20, 40, 60, "auto"):
            raise ValueError('an Opus packet holds 20, 40 or 60 ms of audio here (or "auto")')
        return value


class TwilioSection(_Section):
    #: when set, voice webhook requests must carry a valid X-Twilio-Signature
    auth_token: SecretStr | None = None


class ToolsSection(_Section):
    #: MCP servers sessions may name in their tools (URL prefixes, matched at a path boundary):
    #: the server makes these requests itself, so only listed ones are contacted. Empty: MCP off
    mcp_allowed_urls: list[str] = Field(default_factory=list)
    #: deadline of one MCP tool listing or call
    mcp_timeout_s: float = Field(default=15.0, gt=0, le=300)


class TransportsSection(_Section):
    webrtc: WebRTCSection = Field(default_factory=WebRTCSection)
    twilio: TwilioSection = Field(default_factory=TwilioSection)


class ServerSettings(_Section):
    """The root of the tree. ``ServerSettings()`` is the defaults; nothing is read from the
    environment here (see :func:`realtime_omni.config_sources.load_settings`)."""

    server: ServerSection = Field(default_factory=ServerSection)
    serving: ServingSection = Field(default_factory=ServingSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)
    store: StoreSection = Field(default_factory=StoreSection)
    auth: AuthSection = Field(default_factory=AuthSection)
    transports: TransportsSection = Field(default_factory=TransportsSection)
    tools: ToolsSection = Field(default_factory=ToolsSection)
    engines: EngineSettings = Field(default_factory=EngineSettings)
