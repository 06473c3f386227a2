// The Chorus web page: plain JavaScript on the server's own HTTP API, no build step, nothing fetched
// from anywhere else. Paths are relative ("v1/voices"), so the page also works behind a path prefix.
"use strict";

(() => {
  const KEY_STORAGE = "chorus.apiKey";
  const JOB_STORAGE = "chorus.job";
  const POLL_MS = 500;
  const POLL_TIMEOUT_MS = 10000;   // a job poll with no answer by then is retried
  const FINAL = new Set(["done", "failed"]);
  const $ = (id) => document.getElementById(id);

  // -- the API key: kept in localStorage, sent as a Bearer token when filled --------------------------
  const keyInput = $("api-key");

  function storage(action, name, value) {
    try {   // localStorage throws in some private modes; the page still works without it
      if (action === "get") return window.localStorage.getItem(name) || "";
      if (action === "set" && value) window.localStorage.setItem(name, value);
      else window.localStorage.removeItem(name);
    } catch (error) {
      return "";
    }
    return "";
  }

  function authHeaders(extra = {}) {
    const key = keyInput.value.trim();
    return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
  }

  // The server answers errors as {"error": {"message": ...}} (as OpenAI's API does).
  async function errorMessage(response) {
    let message = `${response.status} ${response.statusText || "error"}`;
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch (error) { /* not JSON: keep the status line */ }
    return withHint(response.status, message);
  }

  function withHint(status, message) {
    if (status === 401) return `${message} (fill in the API key at the top of the page)`;
    return message;
  }

  function show(element, message) {
    element.textContent = message || "";
    element.hidden = !message;
  }

  // -- voices ----------------------------------------------------------------------------------------
  const voiceSelect = $("voice");
  const voicesStatus = $("voices-status");

  async function loadVoices(select) {
    const wanted = select || voiceSelect.value;
    voicesStatus.textContent = "Loading voices…";
    let response;
    try {
      response = await fetch("v1/voices", { headers: authHeaders(), cache: "no-store" });
    } catch (error) {
      voicesStatus.textContent = `Could not reach the server: ${error.message}`;
      return;
    }
    if (!response.ok) {
      voicesStatus.textContent = `Could not list voices: ${await errorMessage(response)}`;
      return;
    }
    const voices = (await response.json()).data || [];
    const groups = { base: document.createElement("optgroup"), custom: document.createElement("optgroup") };
    groups.base.label = "Speakers";
    groups.custom.label = "Your voices";
    for (const voice of voices) {
      const option = document.createElement("option");
      option.value = voice.id;
      const ready = voice.status === "ready";
      let text = voice.name && voice.name !== voice.id ? `${voice.name} (${voice.id})` : voice.id;
      if (voice.default) text += " — default";
      if (!ready) text += ` — ${voice.status}`;
      option.textContent = text;
      option.disabled = !ready;
      if (!ready && voice.error) option.title = voice.error;
      (voice.type === "base" ? groups.base : groups.custom).appendChild(option);
    }
    voiceSelect.replaceChildren(...[groups.base, groups.custom].filter((g) => g.children.length));
    const choices = voices.filter((v) => v.status === "ready").map((v) => v.id);
    const preset = voices.find((v) => v.default);
    voiceSelect.value = choices.includes(wanted) ? wanted : (preset ? preset.id : choices[0] || "");
    const custom = voices.filter((v) => v.type !== "base");
    const training = custom.filter((v) => v.status === "training").length;
    voicesStatus.textContent = `${voices.length - custom.length} speakers, ${custom.length} of yours` +
      (training ? ` (${training} training)` : "") + ".";
    customIds = new Set(custom.map((v) => v.id));
    showVoice();
  }

  // -- a voice of yours: its card and scores, and deleting it ----------------------------------------
  const deleteButton = $("delete-voice");
  const cardBox = $("voice-card");
  let customIds = new Set();

  function row(list, name, value) {
    if (value === undefined || value === null || value === "") return;
    const term = document.createElement("dt");
    term.textContent = name;
    const detail = document.createElement("dd");
    detail.textContent = typeof value === "object" ? JSON.stringify(value) : String(value);
    list.append(term, detail);
  }

  async function showVoice() {
    const id = voiceSelect.value;
    const mine = customIds.has(id);
    deleteButton.disabled = !mine;
    cardBox.hidden = true;
    if (!mine) return;
    const response = await fetch(`v1/voices/${encodeURIComponent(id)}`, { headers: authHeaders(), cache: "no-store" });
    if (!response.ok || voiceSelect.value !== id) return;
    const voice = await response.json();
    const card = voice.card;
    if (!card) return;
    const list = $("voice-card-body");
    list.replaceChildren();
    row(list, "Methods", (card.methods || []).join(" + "));
    row(list, "Data", `${Number(card.data_minutes).toFixed(1)} min`);
    row(list, "Training", `${card.steps} steps in ${Number(card.train_seconds).toFixed(0)} s`);
    row(list, "Trained parameters", Number(card.trainable_parameters).toLocaleString("en"));
    for (const [name, value] of Object.entries(card.metrics || {})) row(list, name.replaceAll("_", " "), value);
    for (const [name, value] of Object.entries(card.notes || {})) row(list, name.replaceAll("_", " "), value);
    row(list, "Size", voice.size_bytes ? `${(voice.size_bytes / 1024).toFixed(0)} KB` : "");
    cardBox.hidden = false;
  }

  voiceSelect.addEventListener("change", showVoice);

  deleteButton.addEventListener("click", async () => {
    const id = voiceSelect.value;
    if (!customIds.has(id) || !window.confirm(`Delete voice ${id}? This cannot be undone.`)) return;
    const response = await fetch(`v1/voices/${encodeURIComponent(id)}`, { method: "DELETE", headers: authHeaders() });
    voicesStatus.textContent = response.ok ? `Deleted ${id}.` : `Could not delete ${id}: ${await errorMessage(response)}`;
    if (response.ok) await loadVoices();
  });

  // -- speech ----------------------------------------------------------------------------------------
  const audio = $("audio");
  const speakButton = $("speak");
  const speakStatus = $("speak-status");
  const speakError = $("speak-error");
  const speed = $("speed");
  let audioUrl = null;

  speed.addEventListener("input", () => {
    $("speed-value").textContent = `${Number(speed.value).toFixed(2)}×`;
  });

  // Text of several sentences is streamed, so its WAV header says "unknown length" (0xFFFFFFFF):
  // once the whole body is here, write the real sizes so that every player knows the duration.
  function fixWavSizes(buffer) {
    const view = new DataView(buffer);
    const tag = (at) => String.fromCharCode(...new Uint8Array(buffer, at, 4));
    if (buffer.byteLength < 44 || tag(0) !== "RIFF" || tag(8) !== "WAVE") return buffer;
    view.setUint32(4, buffer.byteLength - 8, true);
    let at = 12;
    while (at + 8 <= buffer.byteLength) {
      const size = view.getUint32(at + 4, true);
      if (tag(at) === "data") {
        view.setUint32(at + 4, Math.min(size, buffer.byteLength - at - 8), true);
        break;
      }
      at += 8 + size + (size % 2);
    }
    return buffer;
  }

  const formatSelect = $("format");
  const streamPlay = $("stream-play");
  const download = $("download");
  const TYPES = { wav: "audio/wav", mp3: "audio/mpeg", opus: "audio/ogg", aac: "audio/aac", flac: "audio/flac" };
  streamPlay.addEventListener("change", () => { formatSelect.disabled = streamPlay.checked; });

  // A 16-bit mono WAV around raw PCM bytes.
  function wavFile(pcm, rate) {
    const header = new DataView(new ArrayBuffer(44));
    const text = (at, s) => [...s].forEach((c, i) => header.setUint8(at + i, c.charCodeAt(0)));
    text(0, "RIFF"); header.setUint32(4, 36 + pcm.byteLength, true); text(8, "WAVE"); text(12, "fmt ");
    header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
    header.setUint32(24, rate, true); header.setUint32(28, rate * 2, true); header.setUint16(32, 2, true);
    header.setUint16(34, 16, true); text(36, "data"); header.setUint32(40, pcm.byteLength, true);
    return new Blob([header.buffer, pcm], { type: "audio/wav" });
  }

  // Raw PCM read as it arrives, each piece scheduled in Web Audio right after the one before.
  async function playStreaming(response, started) {
    const rate = Number(response.headers.get("X-Sample-Rate"));
    const context = new AudioContext({ sampleRate: rate });
    const reader = response.body.getReader();
    const parts = [];
    let carry = new Uint8Array(0), at = context.currentTime + 0.05, firstMs = null, pieces = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const bytes = new Uint8Array(carry.length + value.length);
      bytes.set(carry); bytes.set(value, carry.length);
      const even = bytes.length - (bytes.length % 2);
      carry = bytes.slice(even);
      if (!even) continue;
      const chunk = bytes.slice(0, even);
      parts.push(chunk);
      const samples = new Int16Array(chunk.buffer);
      const buffer = context.createBuffer(1, samples.length, rate);
      buffer.getChannelData(0).set(Float32Array.from(samples, (s) => s / 32768));
      const source = context.createBufferSource();
      source.buffer = buffer;
      source.connect(context.destination);
      at = Math.max(at, context.currentTime);
      source.start(at);
      at += buffer.duration;
      pieces += 1;
      if (firstMs === null) {
        firstMs = performance.now() - started;
        speakStatus.textContent = `Playing (first audio after ${(firstMs / 1000).toFixed(1)} s)…`;
      }
    }
    const pcm = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let offset = 0;
    for (const part of parts) { pcm.set(part, offset); offset += part.length; }
    audio.dataset.streamedPieces = String(pieces);
    audio.dataset.firstAudioMs = String(Math.round(firstMs || 0));
    return { blob: wavFile(pcm, rate), seconds: pcm.byteLength / 2 / rate, extension: "wav" };
  }

  $("speak-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    show(speakError, "");
    const input = $("text").value;
    if (!input.trim()) return show(speakError, "Type some text to speak.");
    if (!voiceSelect.value) return show(speakError, "Choose a voice (none is listed: check the API key).");
    speakButton.disabled = true;
    speakStatus.textContent = "Synthesizing…";
    const started = performance.now();
    const streaming = streamPlay.checked;
    const format = streaming ? "pcm" : formatSelect.value;
    try {
      const response = await fetch("v1/audio/speech", {
        method: "POST",
        headers: authHeaders({ "Content-Type": "application/json" }),
        body: JSON.stringify({ model: "chorus", input, voice: voiceSelect.value, response_format: format,
                               speed: Number(speed.value), ...(streaming ? { sample_rate: 24000 } : {}) }),
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      let result;
      if (streaming) {
        result = await playStreaming(response, started);
      } else {
        const raw = await response.arrayBuffer();
        const body = format === "wav" ? fixWavSizes(raw) : raw;
        const blob = new Blob([body], { type: TYPES[format] });
        const rate = Number(response.headers.get("X-Sample-Rate")) || 22050;
        result = { blob, seconds: format === "wav" ? Math.max(0, body.byteLength - 44) / 2 / rate : null, extension: format };
      }
      if (audioUrl) URL.revokeObjectURL(audioUrl);
      audioUrl = URL.createObjectURL(result.blob);
      audio.src = audioUrl;
      download.href = audioUrl;
      download.download = `${voiceSelect.value}.${result.extension === "opus" ? "ogg" : result.extension}`;
      download.textContent = `Download ${download.download}`;
      download.hidden = false;
      const length = result.seconds === null ? `${(result.blob.size / 1024).toFixed(0)} KB of ${format}` :
        `${result.seconds.toFixed(1)} s of audio`;
      speakStatus.textContent = `${length} from ${voiceSelect.value} in ` +
        `${((performance.now() - started) / 1000).toFixed(1)} s.`;
      if (!streaming) audio.play().catch(() => { /* autoplay refused: the controls are there */ });
    } catch (error) {
      speakStatus.textContent = "";
      show(speakError, `Speech failed: ${error.message}`);
    } finally {
      speakButton.disabled = false;
    }
  });

  // -- onboarding --------------------------------------------------------------------------------------
  const clipsInput = $("clips");
  const transcripts = $("transcripts");
  const archiveInput = $("archive");
  const onboardButton = $("onboard");
  const onboardError = $("onboard-error");
  const jobBox = $("job");
  const jobProgress = $("job-progress");
  const jobStatus = $("job-status");
  let pollTimer = null;

  function transcriptNames(text) {
    return new Set(text.split(/\r?\n/).filter((line) => line.includes("|"))
      .map((line) => line.split("|")[0].trim().split(/[\\/]/).pop()));
  }

  // Choosing clips adds a "filename|" line for each one the transcripts do not name yet.
  clipsInput.addEventListener("change", () => {
    const named = transcriptNames(transcripts.value);
    const missing = [...clipsInput.files].map((f) => f.name).filter((name) => !named.has(name));
    if (!missing.length) return;
    const lines = transcripts.value.replace(/\s+$/, "");
    transcripts.value = (lines ? `${lines}\n` : "") + missing.map((name) => `${name}|`).join("\n");
  });

  function checkUpload() {
    if (!$("voice-name").value.trim()) return "Give the voice a name.";
    const statement = $("consent-statement").value.trim();
    if (statement.length < 10) {
      return "Write the consent statement: who consented to a synthetic voice, how and when.";
    }
    if (!$("consent-confirm").checked) return "Confirm that the person recorded consented.";
    if (archiveInput.files.length) return "";
    const names = [...clipsInput.files].map((f) => f.name).concat(recordings.map((r) => r.name));
    if (!names.length) return "Choose or record the clips (or one zip archive).";
    if (!hasTranscripts()) return "";   // the server transcribes every clip with Whisper
    const named = transcriptNames(transcripts.value);
    const untranscribed = names.filter((name) => !named.has(name));
    if (untranscribed.length) return `No transcript line for: ${untranscribed.join(", ")} (or clear every line to let the server transcribe).`;
    const empty = transcripts.value.split(/\r?\n/).filter((l) => l.includes("|") && !l.split("|").slice(1).join("|").trim());
    if (empty.length) return `Write the text after the '|' for: ${empty.map((l) => l.split("|")[0]).join(", ")} (or clear every line to let the server transcribe).`;
    return "";
  }

  // Lines with text after their '|': without any, the clips go without transcripts.
  function hasTranscripts() {
    return transcripts.value.split(/\r?\n/).some((l) => l.includes("|") && l.split("|").slice(1).join("|").trim());
  }

  // -- recording clips in the browser: the microphone's audio, kept as 16-bit WAV ---------------------
  const recordButton = $("record");
  const stopButton = $("stop-record");
  const recordStatus = $("record-status");
  const recordings = [];
  let recorder = null;

  async function asWav(blob) {
    const context = new AudioContext();
    const decoded = await context.decodeAudioData(await blob.arrayBuffer());
    context.close();
    const channel = decoded.getChannelData(0);
    const pcm = new Int16Array(channel.length);
    for (let i = 0; i < channel.length; i += 1) pcm[i] = Math.max(-1, Math.min(1, channel[i])) * 32767;
    return { blob: wavFile(new Uint8Array(pcm.buffer), decoded.sampleRate), seconds: decoded.duration };
  }

  function listRecordings() {
    $("recordings").replaceChildren(...recordings.map((r, index) => {
      const item = document.createElement("li");
      item.textContent = `${r.name} (${r.seconds.toFixed(1)} s) `;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = `Remove ${r.name}`;
      remove.addEventListener("click", () => { recordings.splice(index, 1); listRecordings(); });
      item.append(remove);
      return item;
    }));
  }

  recordButton.addEventListener("click", async () => {
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (error) {
      recordStatus.textContent = `No microphone: ${error.message}`;
      return;
    }
    const chunks = [];
    recorder = new MediaRecorder(stream);
    recorder.addEventListener("dataavailable", (event) => chunks.push(event.data));
    recorder.addEventListener("stop", async () => {
      stream.getTracks().forEach((track) => track.stop());
      try {
        const { blob, seconds } = await asWav(new Blob(chunks, { type: recorder.mimeType }));
        const name = `recording-${recordings.length + 1}.wav`;
        recordings.push({ name, blob, seconds });
        recordStatus.textContent = `Recorded ${name} (${seconds.toFixed(1)} s).`;
        listRecordings();
      } catch (error) {
        recordStatus.textContent = `The recording could not be read: ${error.message}`;
      }
    });
    recorder.start();
    recordButton.disabled = true;
    stopButton.disabled = false;
    recordStatus.textContent = "Recording… read a sentence aloud, then Stop.";
  });

  stopButton.addEventListener("click", () => {
    if (recorder && recorder.state === "recording") recorder.stop();
    recordButton.disabled = false;
    stopButton.disabled = true;
  });

  function uploadForm() {
    const form = new FormData();
    form.append("name", $("voice-name").value.trim());
    const id = $("voice-id").value.trim();
    if (id) form.append("id", id);
    form.append("consent", $("consent-statement").value.trim());
    if (archiveInput.files.length) {
      form.append("archive", archiveInput.files[0]);
    } else {
      for (const file of clipsInput.files) form.append("clips", file, file.name);
      for (const recording of recordings) form.append("clips", recording.blob, recording.name);
      if (hasTranscripts()) form.append("transcripts", transcripts.value);
    }
    return form;
  }

  // XMLHttpRequest rather than fetch: it reports upload progress.
  function upload(form) {
    return new Promise((resolve, reject) => {
      const request = new XMLHttpRequest();
      request.open("POST", "v1/voices");
      for (const [name, value] of Object.entries(authHeaders())) request.setRequestHeader(name, value);
      request.upload.addEventListener("progress", (event) => {
        if (!event.lengthComputable) return;
        jobProgress.value = event.loaded / event.total;
        jobStatus.textContent = `Uploading: ${(event.loaded / 1e6).toFixed(1)} of ${(event.total / 1e6).toFixed(1)} MB`;
      });
      request.addEventListener("load", () => {
        let body = null;
        try { body = JSON.parse(request.responseText); } catch (error) { /* not JSON */ }
        if (request.status === 202 && body) return resolve(body);
        const message = body && body.error && body.error.message ? body.error.message
          : `${request.status} ${request.statusText || "error"}`;
        reject(new Error(withHint(request.status, message)));
      });
      request.addEventListener("error", () => reject(new Error("the upload did not reach the server")));
      request.send(form);
    });
  }

  $("onboard-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    show(onboardError, "");
    const problem = checkUpload();
    if (problem) return show(onboardError, problem);
    onboardButton.disabled = true;
    stopWatching();
    jobBox.hidden = false;
    $("job-voice").textContent = $("voice-id").value.trim() || $("voice-name").value.trim();
    jobProgress.value = 0;
    jobStatus.textContent = "Uploading…";
    try {
      const job = await upload(uploadForm());
      watch(job);
    } catch (error) {
      jobBox.hidden = true;
      show(onboardError, `Upload refused: ${error.message}`);
    } finally {
      onboardButton.disabled = false;
    }
  });

  function stopWatching() {
    if (pollTimer !== null) clearTimeout(pollTimer);
    pollTimer = null;
  }

  function render(job) {
    jobBox.hidden = false;
    $("job-voice").textContent = job.voice;
    jobProgress.value = job.status === "done" ? 1 : job.progress || 0;
    const percent = `${Math.round((job.status === "done" ? 1 : job.progress || 0) * 100)}%`;
    const words = {
      queued: `Queued (${percent}): waiting for the jobs before it.`,
      running: `Training (${percent})${job.message ? `: ${job.message}` : "."}`,
      interrupted: "Interrupted: the server stopped; the job resumes when it is back.",
      done: `Done: voice ${job.voice} is ready${job.message ? ` (${job.message})` : ""}.`,
      failed: "Failed.",
    };
    jobStatus.textContent = words[job.status] || `${job.status} (${percent})`;
    jobBox.dataset.status = job.status;
  }

  function watch(job) {
    stopWatching();
    storage("set", JOB_STORAGE, job.id);
    render(job);
    let failures = 0;
    // A poll that fails for any reason (no answer within POLL_TIMEOUT_MS, a dropped connection, a 5xx
    // or 429, an unreadable body) is retried with back-off; only the server refusing the job to us (any
    // other 4xx) ends the watch. A hung request must never freeze the status line.
    const retry = (reason) => {
      failures += 1;
      jobStatus.textContent = `Lost contact with the server; retrying… (${reason})`;
      pollTimer = setTimeout(poll, Math.min(10000, POLL_MS * 2 ** failures));
    };
    const poll = async () => {
      pollTimer = null;
      let current;
      try {
        const response = await fetch(`v1/jobs/${encodeURIComponent(job.id)}`, {
          headers: authHeaders(), cache: "no-store", signal: AbortSignal.timeout(POLL_TIMEOUT_MS) });
        if (response.status >= 400 && response.status < 500 && ![408, 429].includes(response.status)) {
          storage("remove", JOB_STORAGE);
          show(onboardError, `Could not follow job ${job.id}: ${await errorMessage(response)}`);
          return;
        }
        if (!response.ok) throw new Error(`${response.status} ${response.statusText || "error"}`);
        current = await response.json();
      } catch (error) {
        retry(error.message);
        return;
      }
      failures = 0;
      render(current);
      if (!FINAL.has(current.status)) {
        pollTimer = setTimeout(poll, POLL_MS);
        return;
      }
      storage("remove", JOB_STORAGE);
      if (current.status === "failed") {
        show(onboardError, `Making voice ${current.voice} failed: ${current.error || current.message || "no reason given"}`);
        loadVoices();
      } else {
        await loadVoices(current.voice);
      }
    };
    pollTimer = setTimeout(poll, FINAL.has(job.status) ? 0 : POLL_MS);
  }

  // -- start -----------------------------------------------------------------------------------------
  keyInput.value = storage("get", KEY_STORAGE);
  keyInput.addEventListener("input", () => storage("set", KEY_STORAGE, keyInput.value.trim()));
  keyInput.addEventListener("change", () => loadVoices());
  $("refresh-voices").addEventListener("click", () => loadVoices());
  loadVoices().then(() => {
    const pending = storage("get", JOB_STORAGE);   // a job still training when the page was last closed
    if (pending) watch({ id: pending, voice: "", status: "queued", progress: 0 });
  });
})();
