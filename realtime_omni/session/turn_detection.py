"""Server VAD turn detection: speech probabilities per frame → speech start/stop decisions.

Pure state machine over the VAD's frame probabilities, so it is tested without a model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpeechStarted:
    audio_start_ms: int


@dataclass
class SpeechStopped:
    audio_end_ms: int


@dataclass
class SilenceStarted:
    """A pause long enough to start preparing a reply (the turn may still go on)."""

    audio_end_ms: int


@dataclass
class SpeechResumed:
    """The pause after :class:`SilenceStarted` ended in more speech: drop what was prepared."""


@dataclass
class TurnCheck:
    """A pause long enough to ask the end-of-turn model whether the turn is over
    (``semantic_vad``); :meth:`TurnDetector.end_now` ends it when the model says so."""

    audio_end_ms: int
    #: which pause this is: a late answer about an earlier pause changes nothing
    pause: int


Decision = SpeechStarted | SpeechStopped | SilenceStarted | SpeechResumed | TurnCheck


class TurnDetector:
    """Hysteresis over frame probabilities.

    Speech starts when ``min_speech_frames`` consecutive frames reach ``threshold``; it stops
    after ``silence_duration_ms`` of frames below ``threshold - 0.15``. Positions are in ms of
    input audio since the stream began.
    """

    def __init__(
        self,
        threshold: float,
        silence_duration_ms: int,
        frame_ms: float = 32.0,
        min_speech_frames: int = 2,
        speculate_after_ms: float | None = 64.0,
        check_after_ms: float | None = None,
    ):
        self.threshold = threshold
        self.release = max(threshold - 0.15, 0.01)
        self.silence_duration_ms = silence_duration_ms
        self.frame_ms = frame_ms
        self.min_speech_frames = min_speech_frames
        self.speculate_after_ms = speculate_after_ms
        #: semantic_vad: silence after which the end-of-turn model is asked (None: never)
        self.check_after_ms = check_after_ms
        self.in_speech = False
        self._checked = False
        self._pause = 0
        self._run = 0
        self._silence_ms = 0.0
        self._speculating = False

    def feed(self, probabilities: list[float], first_frame_start_ms: float) -> list[Decision]:
        decisions: list[Decision] = []
        for index, prob in enumerate(probabilities):
            start_ms = first_frame_start_ms + index * self.frame_ms
            if not self.in_speech:
                self._run = self._run + 1 if prob >= self.threshold else 0
                # a single very confident frame is enough (faster barge-in); else a short run
                if self._run >= self.min_speech_frames or (self._run and prob >= 0.9):
                    self.in_speech = True
                    self._silence_ms = 0.0
                    onset = start_ms - (self._run - 1) * self.frame_ms
                    decisions.append(SpeechStarted(int(onset)))
            else:
                if prob < self.release:
                    self._silence_ms += self.frame_ms
                    end = start_ms + self.frame_ms - self._silence_ms
                    if self._silence_ms >= self.silence_duration_ms:
                        self.in_speech = False
                        self._run = 0
                        self._pause += 1
                        self._speculating = self._checked = False
                        decisions.append(SpeechStopped(int(end)))
                    else:
                        if (self.speculate_after_ms is not None and not self._speculating
                                and self._silence_ms >= self.speculate_after_ms):
                            self._speculating = True
                            decisions.append(SilenceStarted(int(end)))
                        if self.check_after_ms is not None and not self._checked and self._silence_ms >= self.check_after_ms:
                            self._checked = True
                            decisions.append(TurnCheck(int(end), self._pause))
                else:
                    if self._silence_ms:
                        self._pause += 1  # that pause is over
                    self._silence_ms = 0.0
                    self._checked = False
                    if self._speculating:
                        self._speculating = False
                        decisions.append(SpeechResumed())
        return decisions

    def end_now(self, check: TurnCheck) -> SpeechStopped | None:
        """The end-of-turn model says the turn is over: stop at the pause ``check`` saw, if the
        user is still silent in it; None if they spoke again (or the turn already ended)."""
        if not (self.in_speech and self._checked and check.pause == self._pause):
            return None
        self._pause += 1
        self.in_speech = False
        self._run = 0
        self._silence_ms = 0.0
        self._speculating = self._checked = False
        return SpeechStopped(check.audio_end_ms)

    def reset(self) -> None:
        self.in_speech = False
        self._run = 0
        self._silence_ms = 0.0
        self._speculating = self._checked = False
