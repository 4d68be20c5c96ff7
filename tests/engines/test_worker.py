"""Model engines in a supervised worker process (real processes, real models, no mocks).

``echo`` covers the plumbing quickly; ``embedded`` (loaded once for the module, ~4 s on 2 cores,
plus one reload after the SIGKILL test) covers VAD, think/talk streaming, cancellation and crash
recovery with the real cascade.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from realtime_omni.audio import Pcm
from realtime_omni.audio.resample import resample_once
from realtime_omni.engines.base import ModelSession, ThinkerOutput, ThinkRequest, TurnMessage
from realtime_omni.engines.echo import EchoModel
from realtime_omni.engines.worker import (
    IsolatedModel,
    IsolatedSession,
    IsolatedVADSession,
    WorkerClosed,
    WorkerCrashed,
)
from realtime_omni.engines.worker.protocol import RemoteTraceback


def children(pid: int | None = None) -> dict[int, str]:
    """Live (non-zombie) children of ``pid`` from /proc: {pid: cmdline}."""
    parent = os.getpid() if pid is None else pid
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        state, ppid = fields[0], int(fields[1])
        if ppid == parent and state != "Z":
            found[int(entry)] = cmdline
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def request(text: str, max_tokens: int | None = 40, **kwargs) -> ThinkRequest:
    return ThinkRequest(
        instructions="", messages=[TurnMessage("user", text)], max_output_tokens=max_tokens,
        voice="alloy", want_audio=True, **kwargs,
    )


def has_vad(session: ModelSession) -> bool:
    """What the session manager checks (``_has_vad``): the class overrides ``new_vad``."""
    return type(session).new_vad is not ModelSession.new_vad


# ---------------------------------------------------------------------------------------- echo
@pytest.fixture(scope="module")
def echo() -> IsolatedModel:
    model = IsolatedModel("echo")
    messages: list[str] = []
    model.load(messages.append)
    assert messages == ["echo: nothing to load"]  # progress travels from the worker
    yield model
    model.close()


def test_echo_info_comes_from_the_worker(echo: IsolatedModel) -> None:
    assert echo.ready and echo.restarts == 0
    assert echo.pid != os.getpid() and alive(echo.pid)
    assert echo.info == EchoModel.info
    session = echo.open_session()
    assert type(session) is IsolatedSession and not has_vad(session)
    session.close()


def test_a_duplex_model_hears_pcm_across_the_pipe(echo: IsolatedModel) -> None:
    # audio is PCM inside: the samples and their rate cross the process boundary together
    session = echo.open_session()
    heard = Pcm(np.arange(-80, 80, dtype=np.int16), 8000)
    said = session.listen(heard)
    assert said is not None and said.rate == 8000 and np.array_equal(said.samples, heard.samples)
    session.close()


def test_echo_calls_and_remote_errors(echo: IsolatedModel) -> None:
    session = echo.open_session()
    assert list(session.think(request("hi"))) == []
    assert list(session.talk([], "alloy", threading.Event(), True)) == []
    with pytest.raises(NotImplementedError) as err:  # the engine's own exception type
        session.transcribe(np.zeros(1600, np.int16))
    assert isinstance(err.value.__cause__, RemoteTraceback)
    assert "transcribe" in err.value.__cause__.tb
    session.confirm("anything")
    session.close()
    with pytest.raises(RuntimeError, match="closed"):
        session.confirm("after close")


def test_many_rpc_round_trips_in_a_row(echo: IsolatedModel) -> None:
    """Thousands of calls through one pipe stay correct (their timing is printed, not asserted:
    speed belongs to benchmarks)."""
    session = echo.open_session()
    frame = np.zeros(512, np.int16)
    for _ in range(200):
        echo.ping()
    pings = np.array([echo.ping() for _ in range(2000)])
    # a whole call through the worker's call threads, with a VAD frame's payload
    calls = []
    for _ in range(2000):
        start = time.perf_counter()
        echo._call(session.key, "confirm", (frame,))
        calls.append(time.perf_counter() - start)
    session.close()
    print(
        f"\nping RTT median {np.median(pings) * 1e6:.0f} us p99 {np.percentile(pings, 99) * 1e6:.0f} us; "
        f"call RTT median {np.median(calls) * 1e6:.0f} us p99 {np.percentile(calls, 99) * 1e6:.0f} us"
    )
    assert len(pings) == 2000 and (pings > 0).all() and len(calls) == 2000


def test_a_model_that_cannot_load_raises_and_leaves_no_child() -> None:
    model = IsolatedModel("no-such-model")
    with pytest.raises(RuntimeError, match="unknown model"):
        model.load()
    assert not model.ready and not alive(model.pid)


def test_close_leaves_no_child_process() -> None:
    model = IsolatedModel("echo")
    model.load()
    pid = model.pid
    assert pid in children()
    session = model.open_session()
    model.close()
    assert not model.ready
    assert pid not in children() and not alive(pid)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no zombie left behind
    with pytest.raises(WorkerClosed):
        list(session.think(request("hi")))
    # multiprocessing's other children here: live workers of other fixtures, and its resource
    # tracker (one per server process, started by the first spawn; it exits with the server)
    others = [cmd for cmd in children().values() if "multiprocessing" in cmd]
    assert all("resource_tracker" in cmd or "spawn_main" in cmd for cmd in others)


def _until_every_thread_stopped(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(state in "tT" for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} did not stop")


def test_a_call_to_a_hung_worker_gives_up_at_its_deadline_and_the_worker_serves_on() -> None:
    """A worker that stops answering (stopped by SIGSTOP here: a hung engine call looks the
    same from the server) fails the call with WorkerTimeout at its deadline instead of holding
    the caller's thread for ever; once it answers again, its late answer is dropped and the
    next call works."""
    from realtime_omni.engines.worker import WorkerTimeout

    model = IsolatedModel("echo", call_timeout_s=0.5)
    model.load()
    try:
        model.ping()
        os.kill(model.pid, signal.SIGSTOP)
        _until_every_thread_stopped(model.pid)  # a thread can still answer just after the kill
        try:
            began = time.monotonic()
            with pytest.raises(WorkerTimeout, match="did not answer 'ping' within"):
                model.ping()
            assert time.monotonic() - began < 3.0
        finally:
            os.kill(model.pid, signal.SIGCONT)
        assert model.ping() < 3.0
    finally:
        model.close()


def _until_not_ready(model: IsolatedModel, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while model.ready and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not model.ready


class _SlowLoadingEcho(EchoModel):
    def load(self, progress=lambda _msg: None) -> None:
        time.sleep(2.0)


def slow_loading_echo() -> EchoModel:
    """An echo model that takes 2 s to load (built in the worker process: importable)."""
    return _SlowLoadingEcho()


def test_a_session_closed_while_its_call_waits_for_a_restart_is_not_reopened_there() -> None:
    """A call waiting for a restarting worker, and its session closed meanwhile: the call
    fails as closed when the new worker is up, instead of opening the session afresh there
    (nothing would ever close that one, and it would hold one of the worker's slots)."""
    model = IsolatedModel("slow-echo", slow_loading_echo)
    model.load()
    try:
        session = model.open_session()
        os.kill(model.pid, signal.SIGKILL)
        _until_not_ready(model)  # the supervisor has seen it die and is starting another (2 s to load)
        outcome: list[BaseException | None] = []

        def call() -> None:
            try:
                model._call(session.key, "stats", ())
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001
                outcome.append(exc)

        waiting = threading.Thread(target=call)
        waiting.start()
        time.sleep(0.2)
        session.close()  # the worker is down: its close cannot reach it
        waiting.join(60)
        assert len(outcome) == 1 and isinstance(outcome[0], WorkerClosed), outcome
        assert model.ping() < 5.0  # the new worker is up and serves
    finally:
        model.close()


class _HangsOnItsSecondLoad(EchoModel):
    def load(self, progress=lambda _msg: None) -> None:
        counter = os.environ["REALTIME_OMNI_TEST_LOAD_COUNTER"]
        with open(counter, "a") as f:
            f.write("x")
        with open(counter) as f:
            if len(f.read()) == 2:
                time.sleep(120)  # the first restart hangs while loading


def hangs_on_its_second_load() -> EchoModel:
    return _HangsOnItsSecondLoad()


def test_a_restarted_worker_that_hangs_while_loading_is_killed_and_started_again(tmp_path, monkeypatch) -> None:
    """load_timeout_s holds for restarts too: a worker that never reports ready after a crash
    is killed and another started, instead of leaving the model unavailable for good."""
    monkeypatch.setenv("REALTIME_OMNI_TEST_LOAD_COUNTER", str(tmp_path / "loads"))
    model = IsolatedModel("hang-echo", hangs_on_its_second_load, load_timeout_s=3.0, call_wait_s=30.0)
    model.load()
    try:
        first = model.pid
        began = time.monotonic()
        os.kill(first, signal.SIGKILL)
        _until_not_ready(model)  # the supervisor has seen it die
        assert model.ping() < 5.0  # waits through the hung restart (3 s) and the next one
        assert 2.5 < time.monotonic() - began < 25.0
        assert (tmp_path / "loads").read_text() == "xxx"
    finally:
        model.close()


def test_worker_exits_when_the_server_dies() -> None:
    script = textwrap.dedent(
        """
        import time
        from realtime_omni.engines.worker import IsolatedModel
        model = IsolatedModel("echo")
        model.load()
        print(model.pid, flush=True)
        time.sleep(60)
        """
    )
    server = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(server.stdout.readline())
        assert alive(worker)
        server.kill()  # no cleanup runs in the server
        server.wait()
        deadline = time.monotonic() + 3.0
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(worker)
    finally:
        server.kill()
        server.wait()


# ------------------------------------------------------------------------------------ embedded
@pytest.fixture(scope="module")
def embedded() -> IsolatedModel:
    pytest.importorskip("llguidance")
    pytest.importorskip("faster_whisper")
    pytest.importorskip("piper")
    model = IsolatedModel("embedded")
    messages: list[str] = []
    model.load(messages.append)
    assert any("VAD" in m for m in messages) and any("TTS" in m for m in messages)
    yield model
    model.close()


@pytest.fixture(scope="module")
def local_vad():
    """The same Silero VAD, in this process, to compare against."""
    from realtime_omni.engines.embedded.vad_silero import SileroVAD

    return SileroVAD()


def test_the_speaking_rate_crosses_the_process_boundary(embedded: IsolatedModel) -> None:
    session = embedded.open_session()
    segment = [ThinkerOutput(text="One, two, three, four, five, six, seven, eight, nine, ten.")]
    try:
        normal = sum(len(o.audio) for o in session.talk(segment, "alloy", threading.Event(), True))
        fast = sum(len(o.audio) for o in session.talk(segment, "alloy", threading.Event(), True, 1.5))
    finally:
        session.close()
    assert fast < 0.85 * normal, (fast, normal)


@pytest.fixture(scope="module")
def speech_16k(embedded: IsolatedModel) -> np.ndarray:
    """Piper speech synthesized through the proxy's talk(), at 16 kHz, padded with silence."""
    text = "What is the capital of France? Paris, of course."
    session = embedded.open_session()
    try:
        outs = list(session.talk([ThinkerOutput(text=text)], "alloy", threading.Event(), True))
    finally:
        session.close()
    assert outs and outs[-1].final and "".join(o.text for o in outs) == text
    speech = np.concatenate([o.audio for o in outs])
    pcm = resample_once(speech, embedded.info.output_rate, 16_000)
    silence = np.zeros(8_000, np.int16)
    clip = np.concatenate([silence, pcm, silence])
    return np.concatenate([clip, np.zeros(-len(clip) % 512, np.int16)])


def test_embedded_session_has_vad(embedded: IsolatedModel) -> None:
    assert embedded.info.id == "embedded" and embedded.info.output_rate == 22_050
    session = embedded.open_session()
    assert type(session) is IsolatedVADSession and has_vad(session)
    assert session.new_vad().frame_samples == 512
    session.close()


def test_vad_through_the_proxy_equals_in_process(embedded: IsolatedModel, local_vad, speech_16k: np.ndarray) -> None:
    session = embedded.open_session()
    remote, local = session.new_vad(), local_vad.stream()
    # one call for the whole clip, then frame by frame after a reset (fresh state both sides)
    np.testing.assert_allclose(remote.probabilities(speech_16k), local.probabilities(speech_16k), atol=1e-6)
    remote.reset()
    local.reset()
    proxied, in_process, remote_s, local_s = [], [], [], []
    for start in range(0, len(speech_16k), 512):
        frame = speech_16k[start : start + 512]
        t0 = time.perf_counter()
        proxied += remote.probabilities(frame)
        t1 = time.perf_counter()
        in_process += local.probabilities(frame)
        local_s.append(time.perf_counter() - t1)
        remote_s.append(t1 - t0)
    session.close()
    np.testing.assert_allclose(proxied, in_process, atol=1e-6)
    assert max(proxied) > 0.9 and min(proxied[:5]) < 0.1  # speech found, silence not
    added = np.median(remote_s) - np.median(local_s)
    print(
        f"\nVAD per 32 ms frame: proxy median {np.median(remote_s) * 1e6:.0f} us, "
        f"in-process {np.median(local_s) * 1e6:.0f} us, added {added * 1e6:.0f} us"
    )
    assert added < 5e-3


def test_think_and_talk_stream_through_the_proxy(embedded: IsolatedModel) -> None:
    session = embedded.open_session()
    outs = list(session.think(request("What is the capital of France?", max_tokens=30)))
    assert outs and outs[0].prompt_tokens and outs[0].prompt_tokens > 0
    text = "".join(o.text for o in outs)
    assert text.strip()
    spoken = list(session.talk(outs, "alloy", threading.Event(), True))
    assert spoken and spoken[-1].final and "".join(o.text for o in spoken) == text
    assert sum(len(o.audio) for o in spoken) > 0
    session.confirm(text[: len(text) // 2])  # cuts the worker-side context back
    session.close()


def test_cancel_stops_a_long_think_quickly(embedded: IsolatedModel) -> None:
    session = embedded.open_session()
    req = request("Tell me a very long story about a dragon and a knight.", max_tokens=1500)
    received = 0
    stopped_after = None
    started = None
    for _ in session.think(req):
        received += 1
        if received == 3:
            req.cancelled.set()
            started = time.perf_counter()
    stopped_after = time.perf_counter() - started
    print(f"\ncancel → think ended (worker confirmed) in {stopped_after * 1e3:.0f} ms")
    assert received == 3  # nothing yielded after the cancel
    assert stopped_after < 0.3
    # the worker's generator really stopped: the same session thinks again right away
    assert list(session.think(request("Say hi.", max_tokens=5)))
    session.close()


def test_stream_window_bounds_items_in_flight(embedded: IsolatedModel) -> None:
    session = embedded.open_session()
    req = request("Tell me a very long story about a dragon and a knight.", max_tokens=1500)
    items = session.think(req)
    next(items)
    time.sleep(1.0)  # a stalled consumer: the worker may run at most a window ahead
    channel = embedded._supervisor.current()
    (call,) = channel._pending.values()
    assert 0 < call.queue.qsize() <= embedded.stream_window
    req.cancelled.set()
    assert len(list(items)) == 0
    assert not channel._pending  # the call finished in the worker (END received)
    session.close()


def test_sigkill_fails_pending_calls_then_restarts(embedded: IsolatedModel, local_vad, speech_16k: np.ndarray) -> None:
    session = embedded.open_session()
    vad = session.new_vad()
    vad.probabilities(speech_16k[:512 * 20])  # VAD state now lives in this worker
    old_pid, restarts = embedded.pid, embedded.restarts
    items = session.think(request("Tell me a very long story about a dragon and a knight.", max_tokens=1500))
    next(items)
    os.kill(old_pid, signal.SIGKILL)
    killed = time.perf_counter()
    with pytest.raises(WorkerCrashed):
        for _ in items:
            pass
    detected = time.perf_counter() - killed
    assert detected < 2.0
    # a call made while the worker restarts waits for it instead of failing
    waited: dict[str, object] = {}

    def think_meanwhile() -> None:
        try:
            waited["text"] = "".join(o.text for o in session.think(request("Say hi.", max_tokens=8)))
        except Exception as exc:  # noqa: BLE001
            waited["error"] = exc

    meanwhile = threading.Thread(target=think_meanwhile)
    meanwhile.start()
    assert embedded.wait_ready(60.0)
    restarted = time.perf_counter() - killed
    meanwhile.join(60.0)
    print(f"\nSIGKILL → WorkerCrashed in {detected * 1e3:.0f} ms; worker ready again in {restarted:.1f} s")
    assert "error" not in waited and waited.get("text")
    assert embedded.pid != old_pid and embedded.restarts == restarts + 1
    assert not alive(old_pid)
    # the session carries on: new thinker context from the request, VAD state restarted
    assert "".join(o.text for o in session.think(request("What is the capital of France?", max_tokens=20))).strip()
    fresh = local_vad.stream()
    np.testing.assert_allclose(vad.probabilities(speech_16k[:512 * 40]), fresh.probabilities(speech_16k[:512 * 40]), atol=1e-6)
    session.close()


def test_two_sessions_opening_at_once_on_a_full_worker_do_not_both_fit():
    """The worker is the authority on its capacity: with one slot left and two sessions opening
    at the same moment (a model slow to open a session), one opens and the other is refused,
    also when the open fails part way."""
    import dataclasses
    import multiprocessing

    from realtime_omni.engines.base import ModelAtCapacity
    from realtime_omni.engines.worker.process import WorkerHost

    class SlowToOpen(EchoModel):
        info = dataclasses.replace(EchoModel.info, max_sessions=1)
        fail_next = False

        def open_session(self):
            time.sleep(0.2)  # e.g. an omni session taking its slots
            if SlowToOpen.fail_next:
                SlowToOpen.fail_next = False
                raise RuntimeError("no memory for this session")
            return super().open_session()

    ours, _theirs = multiprocessing.Pipe()
    host = WorkerHost(ours)
    host.serve(SlowToOpen())
    outcomes: list[str] = []

    def open_(key: int) -> None:
        try:
            host.open(key)
            outcomes.append("opened")
        except ModelAtCapacity:
            outcomes.append("refused")

    threads = [threading.Thread(target=open_, args=(key,)) for key in (1, 2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert sorted(outcomes) == ["opened", "refused"] and host.live_sessions == 1
    # a failed open gives its reservation back: after a close, the next open fits
    host.close_session(1 if 1 in host._sessions else 2)
    SlowToOpen.fail_next = True
    try:
        host.open(3)
    except RuntimeError:
        pass
    host.open(4)
    assert host.live_sessions == 1
