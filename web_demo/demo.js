// realtime-omni browser demo: WebRTC to /v1/realtime/calls, events on the "oai-events" channel.
// No build step. URL options: ?autostart=1 (start at load), ?raw=1 (no echo cancellation /
// noise suppression / gain control: what a test's fake microphone needs).
"use strict";

const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const VOICE_RMS = 0.02;   // microphone level that counts as the user speaking
const HEARD_RMS = 0.01;   // agent level that counts as audio heard

// Everything the page knows, readable by tests as window.demo.
const demo = (window.demo = {
  status: "idle", pipeline: null, callId: null, events: 0, errors: [],
  turns: [],          // {item, user, assistant, latencyMs, timings, interrupted}
  user: {}, assistant: {},   // transcripts by item id
  maxRemoteRms: 0, maxLocalRms: 0, cleared: 0,
});

let pc = null, channel = null, micStream = null, audioCtx = null, meterTimer = null;
let localAnalyser = null, remoteAnalyser = null;
let lastVoiceAt = 0;          // performance.now() of the last loud microphone sample
let pendingTurn = null;       // a turn whose answer has not been heard yet
let currentTurn = null;

function setStatus(text, cls = "") {
  demo.status = text;
  $("status").textContent = text;
  $("status").className = "status " + cls;
}

function rms(analyser) {
  const buf = new Float32Array(analyser.fftSize);
  analyser.getFloatTimeDomainData(buf);
  let sum = 0;
  for (const v of buf) sum += v * v;
  return Math.sqrt(sum / buf.length);
}

// ------------------------------------------------------------------ transcript view

function bubble(kind, id) {
  let el = document.querySelector(`.msg[data-id="${id}"]`);
  if (!el) {
    el = document.createElement("div");
    el.className = `msg ${kind} pending`;
    el.dataset.id = id;
    el.textContent = kind === "user" ? "…" : "";
    $("transcript").appendChild(el);
  }
  $("transcript").scrollTop = $("transcript").scrollHeight;
  return el;
}

function setText(kind, id, text, final) {
  const store = kind === "user" ? demo.user : demo.assistant;
  store[id] = text;
  const el = bubble(kind, id);
  el.textContent = text || "…";
  if (final) el.classList.remove("pending");
}

function showError(message) {
  demo.errors.push(message);
  const line = document.createElement("div");
  line.className = "error-line";
  line.textContent = "⚠ " + message;
  $("transcript").appendChild(line);
}

// ------------------------------------------------------------------ latency view

function showLatency(turn) {
  $("latency").textContent = Math.round(turn.latencyMs);
  const recent = demo.turns.filter((t) => t.latencyMs != null).slice(-8).map((t) => Math.round(t.latencyMs));
  $("history").textContent = recent.length > 1 ? "recent: " + recent.join(" · ") + " ms" : "";
}

function showTimeline(timings) {
  // response.done metadata from the server: timing.<stage>_ms, from the end of the user's turn
  const rows = Object.entries(timings).map(([k, v]) => [k.replace(/^timing\./, "").replace(/_ms$/, ""), parseFloat(v)]);
  const box = $("timeline");
  box.replaceChildren();
  if (!rows.length) return;
  const lo = Math.min(0, ...rows.map((r) => r[1]));
  const hi = Math.max(1, ...rows.map((r) => r[1]));
  for (const [name, ms] of rows.sort((a, b) => a[1] - b[1])) {
    const row = document.createElement("div");
    row.className = "row";
    const bar = document.createElement("div");
    bar.className = "bar";
    const fill = document.createElement("i");
    fill.style.left = `${((Math.min(0, ms) - lo) / (hi - lo)) * 100}%`;
    fill.style.width = `${Math.max(1, (Math.abs(ms) / (hi - lo)) * 100)}%`;
    bar.appendChild(fill);
    row.append(Object.assign(document.createElement("span"), { textContent: name }), bar,
      Object.assign(document.createElement("span"), { textContent: `${Math.round(ms)} ms` }));
    box.appendChild(row);
  }
}

// ------------------------------------------------------------------ events

function onEvent(e) {
  demo.events += 1;
  switch (e.type) {
    case "input_audio_buffer.speech_started":
      bubble("user", e.item_id);
      break;
    case "input_audio_buffer.speech_stopped":
      currentTurn = { item: e.item_id, user: "", assistant: "", latencyMs: null, timings: {}, interrupted: false,
                      speechEnd: lastVoiceAt, stoppedAt: performance.now() };
      demo.turns.push(currentTurn);
      pendingTurn = currentTurn;
      break;
    case "conversation.item.input_audio_transcription.delta":
      setText("user", e.item_id, (demo.user[e.item_id] || "") + e.delta, false);
      break;
    case "conversation.item.input_audio_transcription.completed":
      setText("user", e.item_id, e.transcript, true);
      for (const t of demo.turns) if (t.item === e.item_id) t.user = e.transcript;
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      setText("assistant", e.item_id, (demo.assistant[e.item_id] || "") + e.delta, false);
      if (currentTurn) currentTurn.assistant = demo.assistant[e.item_id];
      break;
    case "response.output_item.done": {
      const part = (e.item.content || [])[0];
      if (part && e.item.role === "assistant") setText("assistant", e.item.id, part.transcript ?? part.text ?? "", true);
      break;
    }
    case "response.done": {
      const meta = e.response.metadata || {};
      const timings = Object.fromEntries(Object.entries(meta).filter(([k]) => k.startsWith("timing.")));
      if (currentTurn) currentTurn.timings = timings;
      showTimeline(timings);
      break;
    }
    case "output_audio_buffer.cleared":
      demo.cleared += 1;
      document.querySelectorAll(".msg.assistant").forEach((el, i, all) => i === all.length - 1 && el.classList.add("cut"));
      if (currentTurn) currentTurn.interrupted = true;
      break;
    case "conversation.item.truncated":
      break;
    case "error":
      showError(e.error.message);
      break;
  }
}

// ------------------------------------------------------------------ audio meters and latency

function tick() {
  const now = performance.now();
  if (localAnalyser) {
    const level = rms(localAnalyser);
    demo.maxLocalRms = Math.max(demo.maxLocalRms, level);
    $("level-in").style.width = `${Math.min(100, level * 500)}%`;
    if (level > VOICE_RMS) lastVoiceAt = now;
  }
  if (remoteAnalyser) {
    const level = rms(remoteAnalyser);
    demo.maxRemoteRms = Math.max(demo.maxRemoteRms, level);
    $("level-out").style.width = `${Math.min(100, level * 500)}%`;
    if (pendingTurn && level > HEARD_RMS && now > pendingTurn.stoppedAt) {
      pendingTurn.latencyMs = now - pendingTurn.speechEnd;
      showLatency(pendingTurn);
      pendingTurn = null;
    }
  }
}

// ------------------------------------------------------------------ connection

async function key(config) {
  if (!config.needs_key) return null;
  if (config.can_mint) {
    const r = await fetch("/demo/key", { method: "POST" });
    if (!r.ok) throw new Error(`could not get a key (${r.status})`);
    return (await r.json()).value;
  }
  const typed = $("key").value.trim();
  if (!typed) throw new Error("this server needs an ephemeral key: paste one above");
  return typed;
}

async function start() {
  setStatus("connecting…");
  const config = await (await fetch("/demo/config")).json();
  const raw = params.get("raw") === "1";
  micStream = await navigator.mediaDevices.getUserMedia({
    audio: { echoCancellation: !raw, noiseSuppression: !raw, autoGainControl: !raw, channelCount: 1 },
  });
  audioCtx = new AudioContext();
  await audioCtx.resume();
  localAnalyser = audioCtx.createAnalyser();
  localAnalyser.fftSize = 512;
  audioCtx.createMediaStreamSource(micStream).connect(localAnalyser);

  pc = new RTCPeerConnection({ iceServers: config.ice_servers || [] });
  pc.addTrack(micStream.getAudioTracks()[0], micStream);
  pc.ontrack = (ev) => {
    const stream = ev.streams[0] || new MediaStream([ev.track]);
    $("remote").srcObject = stream;   // plays it (and lets WebAudio see it)
    $("remote").play().catch(() => {});
    remoteAnalyser = audioCtx.createAnalyser();
    remoteAnalyser.fftSize = 512;
    audioCtx.createMediaStreamSource(stream).connect(remoteAnalyser);
  };
  pc.onconnectionstatechange = () => {
    if (pc && ["failed", "closed", "disconnected"].includes(pc.connectionState)) setStatus(pc.connectionState, "error");
  };
  channel = pc.createDataChannel("oai-events");
  channel.onmessage = (m) => onEvent(JSON.parse(m.data));
  channel.onopen = () => setStatus("live — talk", "live");
  channel.onclose = () => demo.status === "live — talk" && setStatus("call ended", "error");

  await pc.setLocalDescription(await pc.createOffer());
  const headers = { "Content-Type": "application/sdp" };
  const k = await key(config);
  if (k) headers.Authorization = `Bearer ${k}`;
  const r = await fetch("/v1/realtime/calls", { method: "POST", body: pc.localDescription.sdp, headers });
  if (r.status !== 201) {
    const body = await r.json().catch(() => ({}));
    throw new Error(body.error ? body.error.message : `the server answered ${r.status}`);
  }
  demo.callId = (r.headers.get("Location") || "").split("/").pop();
  await pc.setRemoteDescription({ type: "answer", sdp: await r.text() });
  meterTimer = setInterval(tick, 10);
  $("mic").classList.add("on");
}

async function stop() {
  clearInterval(meterTimer);
  if (channel) channel.close();
  if (pc) pc.close();
  if (micStream) micStream.getTracks().forEach((t) => t.stop());
  if (audioCtx) audioCtx.close();
  pc = channel = micStream = audioCtx = localAnalyser = remoteAnalyser = null;
  $("level-in").style.width = $("level-out").style.width = "0%";
  $("mic").classList.remove("on");
  setStatus("idle");
}

$("mic").addEventListener("click", () => {
  if (pc) return stop();
  start().catch((err) => { showError(err.message || String(err)); setStatus("error", "error"); stop().then(() => setStatus("error", "error")); });
});

fetch("/demo/config").then((r) => r.json()).then((config) => {
  demo.pipeline = config.pipeline;
  $("pipeline").textContent = `${config.pipeline} · ${config.model}`;
  $("key-box").hidden = !(config.needs_key && !config.can_mint);
  document.querySelectorAll(".origin").forEach((el) => (el.textContent = location.origin));
  if (params.get("autostart") === "1") $("mic").click();
});
