// realtime-omni browser demo: WebRTC with the OpenAI Realtime GA flow, no build step, no
// third-party code. The microphone goes on an audio track, the assistant's voice comes back on
// the remote track, and JSON events travel on the "oai-events" data channel.

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"), connect: $("connect"), disconnect: $("disconnect"), state: $("state"),
  micLevel: $("mic-level"), outLevel: $("out-level"), latency: $("latency"), received: $("received"),
  transcript: $("transcript"), latencies: $("latencies"), error: $("error"), remote: $("remote"),
  face: $("face"), faceSection: $("face-section"),
  interrupt: $("interrupt"), say: $("say"), text: $("text"), send: $("send"), modelInfo: $("model-info"),
  hint: $("hint"),
};

// Everything a test (or a curious person in the console) may want to read.
const demoState = {
  connected: false,
  state: "disconnected",
  model: null,
  callId: null,
  capabilities: [],
  eventsReceived: 0,
  eventTypes: {},
  userTranscripts: [],
  assistantTranscripts: [],
  typed: [],             // messages sent from the text box
  activeResponse: null,  // id of the response in progress, if any
  assistantAudio: false, // the assistant's audio is playing (output_audio_buffer.started → stopped)
  interrupts: 0,         // Interrupt presses that reached the server
  turns: [],             // {speechStoppedAt, eventMs, audioMs}
  audioPacketsReceived: 0,
  totalAudioEnergy: 0,
  maxAudioLevel: 0,
  audioReceived: false,
  errors: [],
};
window.demoState = demoState;

let pc = null;
let dc = null;
let micStream = null;
let audioCtx = null;
let statsTimer = null;
let micTimer = null;
let callUrl = null;
let pendingTurn = null;        // the turn whose first audio we are waiting for
const lines = new Map();       // response_id → <li> of the assistant's transcript
const capabilities = new Map(); // model id → what it can take and give

function setState(state) {
  demoState.state = state;
  const labels = { listening: "listening", user: "you are speaking", thinking: "thinking…",
    assistant: "assistant speaking", disconnected: "disconnected", connecting: "connecting…" };
  ui.state.textContent = labels[state] || state;
  ui.state.className = `state ${state}`;
}

function showError(message) {
  demoState.errors.push(message);
  ui.error.textContent = message;
  ui.error.hidden = false;
}

async function loadModels() {
  try {
    const res = await fetch("/v1/models");
    const body = await res.json();
    ui.model.innerHTML = "";
    for (const m of body.data) {
      const option = document.createElement("option");
      option.value = m.id;
      option.textContent = m.id;
      capabilities.set(m.id, m.capabilities || []);
      ui.model.append(option);
    }
    showModelInfo();
  } catch (err) {
    showError(`could not list models: ${err}`);
  }
}

function showModelInfo() {
  const caps = capabilities.get(ui.model.value) || [];
  ui.modelInfo.textContent = caps.length ? `${ui.model.value}: ${caps.join(", ")}` : "";
}

function updateControls() {
  const open = demoState.connected;
  ui.text.disabled = !open;
  ui.send.disabled = !open;
  ui.interrupt.disabled = !open || !(demoState.activeResponse || demoState.assistantAudio);
  ui.model.disabled = open || ui.connect.disabled;
  ui.hint.classList.toggle("connected", open);
}

function interrupt() {
  // A reply that is already playing is cut on the track (output_audio_buffer.clear, WebRTC only);
  // one that has not started to sound yet is cancelled.
  if (demoState.assistantAudio) send({ type: "output_audio_buffer.clear" });
  else if (demoState.activeResponse) send({ type: "response.cancel" });
  else return;
  demoState.interrupts += 1;
}

function sayText(event) {
  event.preventDefault();
  const text = ui.text.value.trim();
  if (!text || !demoState.connected) return;
  interrupt(); // a new message replaces a reply in progress
  send({ type: "conversation.item.create", item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
  send({ type: "response.create" });
  demoState.typed.push(text);
  addLine("user", text).classList.add("typed");
  ui.text.value = "";
  setState("thinking");
}

async function iceServers() {
  try {
    const res = await fetch("/v1/realtime/ice");
    return (await res.json()).ice_servers || [];
  } catch {
    return [];
  }
}

function waitForIceGathering(peer, timeoutMs) {
  if (peer.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { peer.removeEventListener("icegatheringstatechange", check); resolve(); };
    const check = () => { if (peer.iceGatheringState === "complete") done(); };
    peer.addEventListener("icegatheringstatechange", check);
    setTimeout(done, timeoutMs);
  });
}

async function connect() {
  ui.connect.disabled = true;
  ui.model.disabled = true;
  ui.error.hidden = true;
  setState("connecting");
  const model = ui.model.value;
  demoState.model = model;
  try {
    micStream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    pc = new RTCPeerConnection({ iceServers: await iceServers() });
    pc.addTrack(micStream.getAudioTracks()[0], micStream);
    // the server answers with a face whose mouth follows the reply it speaks
    pc.addTransceiver("video", { direction: "recvonly" });
    pc.ontrack = (event) => {
      if (event.track.kind === "video") {
        ui.face.srcObject = new MediaStream([event.track]);
        ui.faceSection.hidden = false;
      } else {
        ui.remote.srcObject = event.streams[0] || new MediaStream([event.track]);
      }
    };
    pc.onconnectionstatechange = () => {
      if (["failed", "closed", "disconnected"].includes(pc?.connectionState)) {
        if (pc.connectionState === "failed") showError("the connection failed");
        if (pc.connectionState !== "disconnected") disconnect();
      }
    };
    dc = pc.createDataChannel("oai-events");
    dc.onopen = onChannelOpen;
    dc.onmessage = (message) => onEvent(JSON.parse(message.data));
    dc.onclose = () => { if (demoState.connected) disconnect(); };

    await pc.setLocalDescription(await pc.createOffer());
    // No trickle ICE in this flow: send the offer once its candidates are in it.
    await waitForIceGathering(pc, 2000);
    const url = `/v1/realtime/calls${model ? `?model=${encodeURIComponent(model)}` : ""}`;
    const res = await fetch(url, { method: "POST", body: pc.localDescription.sdp, headers: { "Content-Type": "application/sdp" } });
    if (res.status !== 201) {
      const body = await res.json().catch(() => ({}));
      throw new Error(body.error ? `${body.error.code}: ${body.error.message}` : `HTTP ${res.status}`);
    }
    callUrl = res.headers.get("Location");
    demoState.callId = callUrl ? callUrl.split("/").pop() : null;
    await pc.setRemoteDescription({ type: "answer", sdp: await res.text() });
    startMeters();
    ui.disconnect.disabled = false;
  } catch (err) {
    showError(`could not connect: ${err.message || err}`);
    await disconnect();
  }
}

function onChannelOpen() {
  demoState.connected = true;
  setState("listening");
  updateControls();
  ui.text.focus();
  // Ask for transcripts of what the user says (the assistant's come with its audio).
  send({ type: "session.update", session: { type: "realtime", audio: { input: { transcription: { model: "whisper-1" } } } } });
}

function send(event) {
  if (dc && dc.readyState === "open") dc.send(JSON.stringify(event));
}

function addLine(who, text) {
  const li = document.createElement("li");
  li.className = who;
  const label = document.createElement("span");
  label.className = "who";
  label.textContent = who === "user" ? "You:" : "Assistant:";
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  li.append(label, body);
  ui.transcript.append(li);
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
  return li;
}

function onEvent(event) {
  demoState.eventsReceived += 1;
  demoState.eventTypes[event.type] = (demoState.eventTypes[event.type] || 0) + 1;
  switch (event.type) {
    case "session.created":
      demoState.capabilities = event.session.capabilities || [];
      break;
    case "input_audio_buffer.speech_started":
      setState("user");
      pendingTurn = null;
      break;
    case "input_audio_buffer.speech_stopped":
      setState("thinking");
      pendingTurn = { speechStoppedAt: performance.now(), eventMs: null, audioMs: null };
      demoState.turns.push(pendingTurn);
      break;
    case "conversation.item.input_audio_transcription.completed":
      if (event.transcript) {
        demoState.userTranscripts.push(event.transcript);
        addLine("user", event.transcript);
      }
      break;
    case "response.output_audio_transcript.delta": {
      let li = lines.get(event.response_id);
      if (!li) {
        li = addLine("assistant", "");
        lines.set(event.response_id, li);
        demoState.assistantTranscripts.push("");
      }
      const text = li.querySelector(".text");
      text.textContent += event.delta;
      demoState.assistantTranscripts[demoState.assistantTranscripts.length - 1] = text.textContent;
      break;
    }
    case "response.created":
      demoState.activeResponse = event.response.id;
      updateControls();
      break;
    case "output_audio_buffer.started":
      demoState.assistantAudio = true;
      updateControls();
      setState("assistant");
      if (pendingTurn && pendingTurn.eventMs === null) {
        pendingTurn.eventMs = performance.now() - pendingTurn.speechStoppedAt;
        renderTurns();
      }
      break;
    case "output_audio_buffer.stopped":
    case "output_audio_buffer.cleared":
      demoState.assistantAudio = false;
      updateControls();
      if (demoState.state === "assistant") setState("listening");
      break;
    case "response.done": {
      const li = lines.get(event.response.id);
      if (li && event.response.status === "cancelled") li.classList.add("interrupted");
      if (demoState.activeResponse === event.response.id) demoState.activeResponse = null;
      updateControls();
      if (demoState.state === "thinking") setState("listening");
      break;
    }
    case "error":
      showError(`${event.error.code || "error"}: ${event.error.message}`);
      break;
    default:
      break;
  }
}

function renderTurns() {
  ui.latencies.innerHTML = "";
  demoState.turns.forEach((turn, index) => {
    const row = document.createElement("tr");
    const fmt = (ms) => (ms === null ? "–" : `${Math.round(ms)} ms`);
    row.innerHTML = `<td>${index + 1}</td><td>${fmt(turn.eventMs)}</td><td>${fmt(turn.audioMs)}</td>`;
    ui.latencies.append(row);
  });
  const last = demoState.turns[demoState.turns.length - 1];
  if (last) ui.latency.textContent = last.audioMs !== null ? `${Math.round(last.audioMs)} ms` : (last.eventMs !== null ? `${Math.round(last.eventMs)} ms (server)` : "–");
}

function startMeters() {
  // Microphone level (Web Audio, local only).
  try {
    audioCtx = new AudioContext();
    const analyser = audioCtx.createAnalyser();
    analyser.fftSize = 512;
    audioCtx.createMediaStreamSource(micStream).connect(analyser);
    const data = new Float32Array(analyser.fftSize);
    micTimer = setInterval(() => {
      analyser.getFloatTimeDomainData(data);
      let sum = 0;
      for (const v of data) sum += v * v;
      ui.micLevel.value = Math.min(1, Math.sqrt(sum / data.length) * 4);
    }, 100);
  } catch { /* no Web Audio: no meter */ }

  // What actually arrives on the remote track: WebRTC stats (audio level, energy, packets).
  statsTimer = setInterval(async () => {
    if (!pc) return;
    const stats = await pc.getStats();
    stats.forEach((report) => {
      if (report.type !== "inbound-rtp" || report.kind !== "audio") return;
      demoState.audioPacketsReceived = report.packetsReceived || 0;
      demoState.totalAudioEnergy = report.totalAudioEnergy || 0;
      const level = report.audioLevel || 0;
      demoState.maxAudioLevel = Math.max(demoState.maxAudioLevel, level);
      if (level > 0.02) demoState.audioReceived = true;
      ui.outLevel.value = Math.min(1, level * 2);
      ui.received.textContent = `${demoState.audioPacketsReceived} packets`;
      if (pendingTurn && pendingTurn.audioMs === null && level > 0.02) {
        pendingTurn.audioMs = performance.now() - pendingTurn.speechStoppedAt;
        renderTurns();
      }
    });
  }, 40);
}

async function disconnect() {
  const wasConnected = demoState.connected;
  demoState.connected = false;
  clearInterval(statsTimer);
  clearInterval(micTimer);
  statsTimer = micTimer = null;
  if (callUrl && wasConnected) {
    // Hang up before closing the connection: a peer that just goes away leaves its session
    // resumable for the grace period, a hang-up ends it.
    await fetch(callUrl, { method: "DELETE", signal: AbortSignal.timeout(2000) }).catch(() => {});
  }
  callUrl = null;
  if (dc) { dc.onclose = null; dc.close(); }
  if (pc) { pc.onconnectionstatechange = null; pc.close(); }
  if (micStream) micStream.getTracks().forEach((t) => t.stop());
  if (audioCtx) audioCtx.close().catch(() => {});
  dc = pc = micStream = audioCtx = null;
  ui.remote.srcObject = null;
  ui.face.srcObject = null;
  ui.faceSection.hidden = true;
  ui.connect.disabled = false;
  ui.disconnect.disabled = true;
  demoState.activeResponse = null;
  demoState.assistantAudio = false;
  updateControls();
  setState("disconnected");
}

ui.connect.addEventListener("click", connect);
ui.disconnect.addEventListener("click", disconnect);
ui.interrupt.addEventListener("click", interrupt);
ui.say.addEventListener("submit", sayText);
ui.model.addEventListener("change", showModelInfo);
window.addEventListener("pagehide", () => { if (callUrl) navigator.sendBeacon?.(`${callUrl}/hangup`); });
loadModels();
