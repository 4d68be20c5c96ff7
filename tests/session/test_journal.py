"""The resume journal: numbers, replay, and the audio a server-side player sends."""

from __future__ import annotations

import numpy as np

from realtime_omni.audio import Pcm
from realtime_omni.session.core import Outgoing
from realtime_omni.session.journal import Journal


def _event(kind: str, audio: bool = False) -> Outgoing:
    pcm = Pcm(np.zeros(480, np.int16), 24_000) if audio else None
    return Outgoing({"type": kind, "event_id": "e"}, audio=pcm)


def _kinds(outs: list[Outgoing]) -> list[str]:
    return [o.event["type"] for o in outs]


def test_a_player_s_audio_keeps_its_number_but_not_its_place() -> None:
    journal = Journal(capacity=64)
    journal.keep_audio = False  # a WebRTC call or a phone line plays the audio
    journal.record(_event("response.created"))
    for _ in range(40):
        journal.record(_event("response.output_audio.delta", audio=True))
    journal.record(_event("response.done"))
    assert journal.last_seq == 42 and len(journal) == 2  # every event numbered; the audio not kept
    missed, gap = journal.since(1)
    assert _kinds(missed) == ["response.done"] and not gap  # nothing a resume could replay was lost
    missed, gap = journal.since(0)
    assert _kinds(missed) == ["response.created", "response.done"] and not gap
    assert [o.event["sequence_number"] for o in missed] == [1, 42]


def test_a_client_that_plays_the_audio_gets_it_replayed() -> None:
    journal = Journal(capacity=64)
    journal.record(_event("response.created"))
    journal.record(_event("response.output_audio.delta", audio=True))
    missed, gap = journal.since(0)
    assert _kinds(missed) == ["response.created", "response.output_audio.delta"] and not gap
    assert missed[1].audio is not None


def test_the_ring_still_reports_a_gap_past_its_capacity() -> None:
    journal = Journal(capacity=4)
    journal.keep_audio = False
    for i in range(10):
        journal.record(_event("response.output_audio.delta", audio=True) if i % 2 else _event("x"))
    missed, gap = journal.since(0)  # four events and four audio numbers kept of ten
    assert len(missed) == 4 and gap
    missed, gap = journal.since(6)
    assert _kinds(missed) == ["x", "x"] and not gap
