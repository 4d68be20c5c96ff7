"""Server settings: command-line flags override ``REALTIME_OMNI_*`` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REALTIME_OMNI_")

    host: str = "127.0.0.1"
    port: int = 8000
    #: models to load; the first is the default for /v1/realtime without ?model=
    models: list[str] = Field(default_factory=lambda: ["embedded", "echo"])
    max_sessions: int = 100
    idle_timeout_s: float = 600.0
    max_session_s: float = 3600.0
    max_event_bytes: int = 15 * 1024 * 1024
    #: audio is sent at most this far ahead of real time (ms); negative disables pacing
    output_lead_ms: float = 1500.0
    model_threads: int = 4
    log_level: str = "info"
    #: folder of the browser demo served at /
    web_dir: str | None = None
