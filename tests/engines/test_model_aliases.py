"""Model ids as clients send them: OpenAI's ids resolve to the served default, as configured."""

from __future__ import annotations

import pytest

from realtime_omni.config import ServerSettings
from realtime_omni.engines.echo import EchoModel
from realtime_omni.engines.registry import ModelRegistry


class Named(EchoModel):
    """An echo model under another id (a second served model, no weights)."""

    def __init__(self, model_id: str) -> None:
        super().__init__()
        self.info = type(self.info)(id=model_id, capabilities=self.info.capabilities)


def registry(*ids: str) -> ModelRegistry:
    reg = ModelRegistry()
    for model_id in ids:
        reg.add(Named(model_id))
    return reg


@pytest.mark.parametrize("requested", ["gpt-realtime", "gpt-realtime-2025-08-28", "gpt-realtime-mini",
                                       "gpt-4o-realtime-preview", "gpt-4o-realtime-preview-2024-12-17",
                                       "gpt-4o-mini-realtime-preview-2024-12-17", None, ""])
def test_openai_ids_and_no_id_mean_the_default(requested):
    reg = registry("embedded", "echo")
    assert reg.resolve(requested) == "embedded"
    assert reg.get(requested) is reg.models["embedded"]


@pytest.mark.parametrize("requested", ["gpt-4o", "whisper-1", "GPT-REALTIME", "embedded2", "xgpt-realtime"])
def test_other_ids_are_not_served(requested):
    reg = registry("embedded", "echo")
    assert reg.resolve(requested) is None and reg.get(requested) is None


def test_served_ids_win_and_aliases_are_configurable():
    reg = registry("embedded", "echo")
    reg.aliases = {"gpt-realtime*": "echo", "my-agent": "default"}
    assert reg.resolve("gpt-realtime-2025-08-28") == "echo"
    assert reg.resolve("my-agent") == "embedded"
    assert reg.resolve("echo") == "echo"
    assert reg.resolve("gpt-4o-realtime-preview") is None  # not configured any more
    assert reg.aliases_of("echo") == ["gpt-realtime*"] and reg.aliases_of("embedded") == ["my-agent"]
    reg.check_aliases()


def test_an_alias_to_a_model_not_served_fails_at_startup():
    reg = registry("embedded")
    reg.aliases = {"gpt-realtime*": "omni"}
    with pytest.raises(ValueError, match="'omni', which is not served"):
        reg.check_aliases()


def test_aliases_come_from_the_settings_tree():
    from realtime_omni.config_sources import load_settings

    assert "gpt-realtime*" in ServerSettings().serving.aliases
    assert load_settings(environ={"REALTIME_OMNI_MODEL_ALIASES": '{"acme-voice-*": "echo"}'}).serving.aliases == {
        "acme-voice-*": "echo"}
