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

  // An HTTP header carries printable ASCII only: a key with a space or an accented letter would make the
  // browser refuse the request with a message that blames the server.
  function keyProblem() {
    return /[^\x21-\x7e]/.test(keyInput.value.trim())
      ? "The API key holds a character no key has (a space, a line break or a non-ASCII letter): paste it again."
      : "";
  }

  // What a fetch() call itself rejects with when no answer came ("Failed to fetch", "NetworkError when
  // attempting ..."), in words a user can act on. Only for that rejection: a server's refusal is said as it is.
  function unreached(error) {
    return error instanceof TypeError
      ? "the server could not be reached (is it running? is the address right?)" : error.message;
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

  // Polls `url` (GET, with the key) until `answer(body)` returns true. A poll that fails for any reason (no
  // answer within POLL_TIMEOUT_MS, a dropped connection, a 5xx or 429, an unreadable body) is retried with
  // back-off, telling `lost(reason)`; only the server refusing (any other 4xx) ends it, with
  // `refused(message)`. A hung request must never freeze a status line. Returns its stop().
  function pollUntil(url, answer, refused, lost, delay = POLL_MS) {
    let timer = null, failures = 0, stopped = false;
    const next = (ms) => { if (!stopped) timer = setTimeout(poll, ms); };
    const poll = async () => {
      timer = null;
      let body;
      try {
        const response = await fetch(url, { headers: authHeaders(), cache: "no-store",
                                             signal: AbortSignal.timeout(POLL_TIMEOUT_MS) });
        if (response.status >= 400 && response.status < 500 && ![408, 429].includes(response.status)) {
          if (!stopped) refused(await errorMessage(response), response.status);
          return;
        }
        if (!response.ok) throw new Error(`${response.status} ${response.statusText || "error"}`);
        body = await response.json();
      } catch (error) {
        failures += 1;
        if (!stopped) lost(error.message);
        next(Math.min(10000, POLL_MS * 2 ** failures));
        return;
      }
      failures = 0;
      if (!stopped && !(await answer(body))) next(POLL_MS);
    };
    next(delay);
    return () => { stopped = true; if (timer !== null) clearTimeout(timer); };
  }

  // -- voices ----------------------------------------------------------------------------------------
  const voiceSelect = $("voice");
  const voicesStatus = $("voices-status");

  // A voice speaks when ready, and a voice made from a sample as soon as it exists (its instant voice); not
  // one adapted on another base than the server's (the store keeps it for a server with that base).
  const speaks = (voice) => voice.this_base !== false && (voice.status === "ready" || voice.stage === "instant");

  // Nothing of a tenant stays on the page once the server refuses its key: no voices, card or Delete.
  function clearVoices(message) {
    listedKey = null;
    voiceSelect.replaceChildren();
    voiceInfo = new Map();
    customIds = new Set();
    showVoice();
    voicesStatus.textContent = message;
  }

  let listed = 0;   // the voice list's requests, counted: only the latest one's answer is shown
  let listedKey = null;   // the key the list on screen was given for

  async function loadVoices(select) {
    const wanted = select || voiceSelect.value;
    const key = keyInput.value.trim();   // the key asked with (the field may change before the answer)
    const request = ++listed;
    if (!key) storage("remove", KEY_STORAGE);   // cleared: forgotten
    if (keyProblem()) return clearVoices(keyProblem());
    voicesStatus.textContent = "Loading voices…";
    let response, body;
    try {
      response = await fetch("v1/voices", { headers: authHeaders(), cache: "no-store" });
      body = response.ok ? await response.json() : null;
    } catch (error) {
      if (request !== listed) return;
      const message = `Could not list voices: ${unreached(error)}`;
      if (key !== listedKey) clearVoices(message);   // not another tenant's list beside this key
      else voicesStatus.textContent = message;
      return;
    }
    if (request !== listed) return;   // a later request's answer decides (an older one had put another tenant's back)
    if (!response.ok) {
      const message = `Could not list voices: ${await errorMessage(response)}`;
      if (request !== listed) return;
      if (![401, 403].includes(response.status) && key === listedKey) {   // busy or failing: the list stays
        voicesStatus.textContent = message;
        return;
      }
      // a key the server refuses is not kept (one kept before that it now refuses is forgotten)
      if (storage("get", KEY_STORAGE) === key) storage("remove", KEY_STORAGE);
      clearVoices(message);
      return;
    }
    storage("set", KEY_STORAGE, key);   // a key is kept once the server has taken it
    listedKey = key;
    const voices = body.data || [];
    const groups = { base: document.createElement("optgroup"), custom: document.createElement("optgroup") };
    groups.base.label = "Speakers";
    groups.custom.label = "Your voices";
    for (const voice of voices) {
      const option = document.createElement("option");
      option.value = voice.id;
      const ready = speaks(voice);
      let text = voice.name && voice.name !== voice.id ? `${voice.name} (${voice.id})` : voice.id;
      if (voice.default) text += " — default";
      if (voice.stage === "instant") text += " — instant voice";
      else if (!ready) text += ` — ${voice.status}`;
      option.textContent = text;
      option.disabled = !ready && voice.type === "base";   // one of yours that cannot speak can still be deleted
      if (!ready && voice.error) option.title = voice.error;
      (voice.type === "base" ? groups.base : groups.custom).appendChild(option);
    }
    voiceSelect.replaceChildren(...[groups.base, groups.custom].filter((g) => g.children.length));
    const choices = voices.filter((v) => speaks(v) || v.type !== "base").map((v) => v.id);
    const preset = voices.find((v) => v.default);
    voiceSelect.value = choices.includes(wanted) ? wanted : (preset ? preset.id : voices.find(speaks)?.id || "");
    const custom = voices.filter((v) => v.type !== "base");
    const training = custom.filter((v) => v.status === "training").length;
    voicesStatus.textContent = `${voices.length - custom.length} speakers, ${custom.length} of yours` +
      (training ? ` (${training} training)` : "") + ".";
    customIds = new Set(custom.map((v) => v.id));
    voiceInfo = new Map(voices.map((v) => [v.id, v]));
    if (speakError.textContent.startsWith(NO_VOICE)) show(speakError, "");
    showVoice();
  }

  // -- a voice of yours: its card and scores, and deleting it ----------------------------------------
  const deleteButton = $("delete-voice");
  const cardBox = $("voice-card");
  let customIds = new Set();
  let voiceInfo = new Map();   // id -> the voice as GET /v1/voices lists it
  const label = (id) => {
    const voice = voiceInfo.get(id);
    return voice && voice.name && voice.name !== id ? `${voice.name} (${id})` : id;
  };

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
    const speech = card.speech_minutes == null ? "" : `, ${Number(card.speech_minutes).toFixed(1)} of speech`;
    row(list, "Data", `${Number(card.data_minutes).toFixed(1)} min of audio${speech}`);
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
    const name = label(id);
    if (!customIds.has(id) || !window.confirm(`Delete voice ${name}? This cannot be undone.`)) return;
    let response;
    try {
      response = await fetch(`v1/voices/${encodeURIComponent(id)}`, { method: "DELETE", headers: authHeaders() });
    } catch (error) {
      voicesStatus.textContent = `Could not delete ${name}: ${unreached(error)}`;
      return;
    }
    voicesStatus.textContent = response.ok ? `Deleted ${name}.` : `Could not delete ${name}: ${await errorMessage(response)}`;
    if (!response.ok) return;
    if (id === cvVoiceId) forgetCustomVoice();   // its box had gone on saying it speaks
    await loadVoices();
  });

  // -- speech ----------------------------------------------------------------------------------------
  const audio = $("audio");
  const speakButton = $("speak");
  const speakStatus = $("speak-status");
  const speakError = $("speak-error");
  const speakNote = $("speak-note");
  const speed = $("speed");
  const textInput = $("text");
  const textCount = $("text-count");
  const NO_VOICE = "Choose a voice";
  const MAX_INPUT = Number(textInput.dataset.max);   // a server's default limit per request (OpenAI's 4,096)
  const characters = (text) => [...text].length;   // as the server counts them (an emoji is one, not two)
  let audioUrl = null;
  let playback = null;   // the streamed answer playing in Web Audio: {context, reader}

  // A new answer, or the player's own controls, end a streamed one still playing (its pieces were
  // scheduled in an AudioContext of their own, which the player's pause does not reach).
  function stopPlayback() {
    if (playback === null) return;
    playback.reader.cancel().catch(() => {});
    playback.context.close().catch(() => {});
    playback = null;
  }
  audio.addEventListener("play", stopPlayback);

  function countText() {
    const count = characters(textInput.value);
    const over = count > MAX_INPUT;
    textCount.textContent = `${count.toLocaleString("en")} characters` + (over
      ? `: over the ${MAX_INPUT.toLocaleString("en")} a server takes by default (chorus serve --max-text-chars sets it)` : "");
  }
  textInput.addEventListener("input", countText);
  countText();

  // What the server could not say (text in a script the voice cannot read, characters it dropped): named
  // in percent-encoded headers beside the audio.
  function leftOut(response) {
    const read = (name) => {
      const value = response.headers.get(name);
      if (!value) return "";
      try { return decodeURIComponent(value); } catch (error) { return value; }
    };
    const skipped = read("X-Skipped-Text"), dropped = read("X-Dropped-Characters"), ignored = read("X-Instructions-Ignored");
    return [skipped && `not spoken: ${skipped}`, dropped && `characters dropped: ${dropped}`,
            ignored && `instructions not followed: ${ignored}`].filter(Boolean).join("; ");
  }

  // The body of an answer that had begun, broken off (the server stopped, the network went): said as such.
  function cutOff(error) {
    throw new Error(error instanceof TypeError ? "the answer was cut off before its end (the server stopped?)" : error.message);
  }

  function clearResult() {
    stopPlayback();
    audio.removeAttribute("src");
    audio.load();
    download.hidden = true;
    if (audioUrl) URL.revokeObjectURL(audioUrl);
    audioUrl = null;
    speakNote.textContent = "";   // kept in the page, empty: a live region shown with its text is often not read
  }

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
    const mine = { context, reader };
    playback = mine;
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
    if (playback !== mine) throw new Error("its playback was stopped before the whole answer came");
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
    const input = textInput.value;
    const voice = voiceSelect.value;   // the voice sent, whatever is chosen while it speaks
    if (!input.trim()) return show(speakError, "Type some text to speak.");
    if (keyProblem()) return show(speakError, keyProblem());
    if (!voice) return show(speakError, `${NO_VOICE} (none is listed: check the API key).`);
    const info = voiceInfo.get(voice);
    if (info && !speaks(info)) {
      return show(speakError, `${label(voice)} cannot speak: it is ${info.status}${info.error ? ` (${info.error})` : ""}.`);
    }
    clearResult();
    speakButton.disabled = true;
    speakStatus.textContent = "Synthesizing…";
    const started = performance.now();
    const streaming = streamPlay.checked;
    const format = streaming ? "pcm" : formatSelect.value;
    try {
      let response;
      try {
        response = await fetch("v1/audio/speech", {
          method: "POST",
          headers: authHeaders({ "Content-Type": "application/json" }),
          body: JSON.stringify({ model: "chorus", input, voice, response_format: format,
                                 speed: Number(speed.value), ...(streaming ? { sample_rate: 24000 } : {}) }),
        });
      } catch (error) {
        throw new Error(unreached(error));
      }
      if (!response.ok) throw new Error(await errorMessage(response));
      const note = leftOut(response);
      let result;
      if (streaming) {
        result = await playStreaming(response, started).catch(cutOff);
      } else {
        const raw = await response.arrayBuffer().catch(cutOff);
        const body = format === "wav" ? fixWavSizes(raw) : raw;
        const blob = new Blob([body], { type: TYPES[format] });
        const rate = Number(response.headers.get("X-Sample-Rate")) || 22050;
        result = { blob, seconds: format === "wav" ? Math.max(0, body.byteLength - 44) / 2 / rate : null, extension: format };
      }
      if (audioUrl) URL.revokeObjectURL(audioUrl);
      audioUrl = URL.createObjectURL(result.blob);
      audio.src = audioUrl;
      download.href = audioUrl;
      download.download = `${voice}.${result.extension === "opus" ? "ogg" : result.extension}`;
      download.textContent = `Download ${download.download}`;
      download.hidden = false;
      const length = result.seconds === null ? `${(result.blob.size / 1024).toFixed(0)} KB of ${format}` :
        `${result.seconds.toFixed(1)} s of audio`;
      speakStatus.textContent = `${length} from ${label(voice)} in ` +
        `${((performance.now() - started) / 1000).toFixed(1)} s.`;
      speakNote.textContent = note && `Spoken without what it could not read: ${note}.`;
      if (!streaming) audio.play().catch(() => { /* autoplay refused: the controls are there */ });
    } catch (error) {
      speakStatus.textContent = "";
      clearResult();
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
  const uploadStatus = $("upload-status");
  const cancelJob = $("cancel-job");
  let stopPolling = null;
  let watchedJob = null;

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

  // -- the microphone: Record starts, Stop ends; `recorded(blob)` gets what it heard, in the browser's own
  // format (webm or ogg: the server decodes both); `prompt()` says what to do meanwhile; `audio`: the
  // getUserMedia constraints --------------------------------------------------------------------------
  function microphone(startButton, stopButton, status, prompt, recorded, audio = true) {
    let recorder = null;
    startButton.addEventListener("click", async () => {
      let stream;
      try {
        stream = await navigator.mediaDevices.getUserMedia({ audio });
      } catch (error) {
        status.textContent = `No microphone: ${error.message}`;
        return;
      }
      const chunks = [];
      const current = new MediaRecorder(stream);
      recorder = current;
      current.addEventListener("dataavailable", (event) => chunks.push(event.data));
      current.addEventListener("stop", async () => {
        stream.getTracks().forEach((track) => track.stop());
        try {
          await recorded(new Blob(chunks, { type: current.mimeType }));
        } catch (error) {
          status.textContent = `The recording could not be read: ${error.message}`;
        }
      });
      current.start();
      startButton.disabled = true;
      stopButton.disabled = false;
      status.textContent = prompt();
    });
    stopButton.addEventListener("click", () => {
      if (recorder && recorder.state === "recording") recorder.stop();
      startButton.disabled = false;
      stopButton.disabled = true;
    });
  }

  async function decode(blob) {
    const context = new AudioContext();
    try {
      return await context.decodeAudioData(await blob.arrayBuffer());
    } finally {
      context.close();
    }
  }

  // -- recording clips in the browser: the microphone's audio, kept as 16-bit WAV ---------------------
  const recordStatus = $("record-status");
  const recordings = [];

  async function asWav(blob) {
    const decoded = await decode(blob);
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

  microphone($("record"), $("stop-record"), recordStatus, () => "Recording… read a sentence aloud, then Stop.", async (raw) => {
    const { blob, seconds } = await asWav(raw);
    const name = `recording-${recordings.length + 1}.wav`;
    recordings.push({ name, blob, seconds });
    recordStatus.textContent = `Recorded ${name} (${seconds.toFixed(1)} s).`;
    listRecordings();
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
        uploadStatus.textContent = `Uploading: ${(event.loaded / 1e6).toFixed(1)} of ${(event.total / 1e6).toFixed(1)} MB`;
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
    if (keyProblem()) return show(onboardError, keyProblem());
    onboardButton.disabled = true;
    uploadStatus.textContent = "Uploading…";
    try {
      const job = await upload(uploadForm());
      if (job.left_out && job.left_out.length) show(onboardError, `Left out of the upload: ${job.left_out.join("; ")}`);
      watch(job);   // a job followed before goes on training on the server, and is listed when done
      uploadStatus.textContent = "";
    } catch (error) {   // a job followed before is followed still
      uploadStatus.textContent = "";
      show(onboardError, `Upload refused: ${error.message}`);
    } finally {
      onboardButton.disabled = false;
    }
  });

  function stopWatching() {
    if (stopPolling !== null) stopPolling();
    stopPolling = null;
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
    cancelJob.hidden = FINAL.has(job.status);
  }

  cancelJob.addEventListener("click", async () => {
    if (keyProblem()) return show(onboardError, keyProblem());
    const voice = $("job-voice").textContent || `of job ${watchedJob}`;
    if (watchedJob === null || !window.confirm(`Stop making voice ${voice}?`)) return;
    cancelJob.disabled = true;
    try {
      const response = await fetch(`v1/jobs/${encodeURIComponent(watchedJob)}/cancel`, { method: "POST", headers: authHeaders() });
      if (!response.ok) show(onboardError, `Could not cancel: ${await errorMessage(response)}`);
    } catch (error) {
      show(onboardError, `Could not cancel: ${unreached(error)}`);
    } finally {
      cancelJob.disabled = false;
    }
  });

  function watch(job) {
    stopWatching();
    watchedJob = job.id;
    storage("set", JOB_STORAGE, job.id);
    render(job);
    const answer = async (current) => {
      render(current);
      if (!FINAL.has(current.status)) return false;
      storage("remove", JOB_STORAGE);
      if (current.status === "failed") {
        show(onboardError, `Making voice ${current.voice} failed: ${current.error || current.message || "no reason given"}`);
        loadVoices();
      } else {
        await loadVoices(current.voice);
      }
      return true;
    };
    const refused = (message, status) => {
      cancelJob.hidden = true;
      stopPolling = null;   // this poll has ended
      // a key refused is no end of the job: it trains on, and is followed again once a key is given
      const keyRefused = [401, 403].includes(status);
      if (!keyRefused) storage("remove", JOB_STORAGE);
      show(onboardError, `Could not follow job ${job.id}: ${message}` + (keyRefused ? "; it is followed again once its key is given" : ""));
    };
    const lost = (reason) => { jobStatus.textContent = `Lost contact with the server; retrying… (${reason})`; };
    stopPolling = pollUntil(`v1/jobs/${encodeURIComponent(job.id)}`, answer, refused, lost,
                            FINAL.has(job.status) ? 0 : POLL_MS);
  }

  // -- a voice from one sample (OpenAI's custom voices): a consent recording, then the sample ----------
  const cvLanguage = $("cv-language");
  const cvError = $("cv-error");
  const cvCreate = $("cv-create");
  const cvCreateStatus = $("cv-create-status");
  const cvBox = $("cv-voice");
  // The speaker encoder compares the consent with the sample, and the refinement learns the voice from
  // the sample: the voice as the microphone hears it, without the call-audio processing browsers add.
  const RAW_AUDIO = { echoCancellation: false, noiseSuppression: false, autoGainControl: false };
  const picked = { consent: null, sample: null };   // {blob, name, seconds (null for a file)}
  let phrases = {};
  let minSampleSeconds = 10;
  let accepted = null;   // the consent the server took: {pick, language, id}, reused until either changes
  let stopFollowing = null;
  let cvVoiceId = null;

  function showPhrase() {
    $("cv-phrase").textContent = phrases[cvLanguage.value] || "";
  }

  let phrased = 0;   // the phrase requests, counted: only the latest one's answer is shown

  async function loadPhrases() {
    const status = $("cv-phrase-status");
    const request = ++phrased;
    let response;
    if (keyProblem()) {
      phrases = {};
      cvLanguage.replaceChildren();
      showPhrase();
      status.textContent = keyProblem();
      return;
    }
    try {
      response = await fetch("v1/audio/voice_consents/phrases", { headers: authHeaders(), cache: "no-store" });
    } catch (error) {
      if (request === phrased) status.textContent = `Could not read the consent phrases: ${unreached(error)}`;
      return;
    }
    if (request !== phrased) return;
    if (!response.ok) {
      const message = await errorMessage(response);
      if (request !== phrased) return;
      phrases = {};   // another tenant's key must not leave its phrase up
      cvLanguage.replaceChildren();
      showPhrase();
      status.textContent = `Could not read the consent phrases: ${message}`;
      return;
    }
    const body = await response.json();
    if (request !== phrased) return;
    phrases = body.phrases || {};
    minSampleSeconds = body.min_sample_seconds;
    $("cv-min-seconds").textContent = String(minSampleSeconds);
    const wanted = cvLanguage.value;
    const languages = Object.keys(phrases).sort();
    cvLanguage.replaceChildren(...languages.map((language) => {
      const option = document.createElement("option");
      option.value = language;
      option.textContent = language;
      return option;
    }));
    cvLanguage.value = languages.includes(wanted) ? wanted : (languages.includes("en") ? "en" : languages[0] || "");
    status.textContent = "";
    showPhrase();
  }

  cvLanguage.addEventListener("change", showPhrase);

  // A recording or a file: the latest chosen is the one sent.
  function pick(part, choice, status) {
    picked[part] = choice;
    if (choice.seconds === null) {
      status.textContent = `${choice.name} chosen.`;
      return;
    }
    const short = part === "sample" && choice.seconds < minSampleSeconds;
    status.textContent = `Recorded ${choice.seconds.toFixed(1)} s` +
      (short ? `: too short, the sample needs ${minSampleSeconds} s of speech or more.` : ".");
  }

  for (const part of ["consent", "sample"]) {
    const status = $(`cv-${part}-status`);
    const fileInput = $(`cv-${part}-file`);
    const prompt = () => (part === "consent" ? "Recording… read the phrase above aloud, then Stop." :
      `Recording… speak for ${minSampleSeconds} s or more (pauses and silence are not counted: about ${Math.ceil(minSampleSeconds * 1.25)} s of reading), then Stop.`);
    microphone($(`cv-${part}-record`), $(`cv-${part}-stop`), status, prompt, async (blob) => {
      const { duration } = await decode(blob);
      const extension = blob.type.includes("ogg") ? "ogg" : blob.type.includes("mp4") ? "m4a" : "webm";
      fileInput.value = "";
      pick(part, { blob, name: `${part}.${extension}`, seconds: duration }, status);
    }, RAW_AUDIO);
    fileInput.addEventListener("change", () => {
      if (fileInput.files.length) pick(part, { blob: fileInput.files[0], name: fileInput.files[0].name, seconds: null }, status);
    });
  }

  // A multipart POST; a refusal is thrown with the server's message (what was heard, the similarity).
  async function postForm(path, fields, refusal) {
    const form = new FormData();
    for (const [name, value] of Object.entries(fields)) {
      if (value.blob) form.append(name, value.blob, value.name);
      else form.append(name, value);
    }
    let response;
    try {
      response = await fetch(path, { method: "POST", headers: authHeaders(), body: form });
    } catch (error) {
      throw new Error(`${refusal}: ${unreached(error)}`);
    }
    if (!response.ok) throw new Error(`${refusal}: ${await errorMessage(response)}`);
    return response.json();
  }

  function checkCustomVoice() {
    if (!$("cv-name").value.trim()) return "Give the voice a name.";
    if (!cvLanguage.value) return "No consent phrase to read: fill in the API key at the top of the page.";
    if (!picked.consent) return "Record the consent phrase (or choose a file of it).";
    if (!picked.sample) return "Record a sample (or choose a file).";
    if (keyProblem()) return keyProblem();
    const seconds = picked.sample.seconds;
    if (seconds !== null && seconds < minSampleSeconds) {
      return `The sample lasts ${seconds.toFixed(1)} s: record ${minSampleSeconds} s of speech or more.`;
    }
    return "";
  }

  // The voice's stage: instant (speaking as voice.instant: a blend of the speakers nearest the sample,
  // then the base speaker that fits it best) until its refinement is done (adapted) or failed (it stays
  // instant, and the server says why).
  function renderStage(voice) {
    cvBox.hidden = false;
    cvBox.dataset.stage = voice.stage;
    cvBox.dataset.refinement = voice.refinement || "";
    $("cv-voice-id").textContent = voice.id;
    let words;
    if (voice.stage === "adapted") words = "adapted: refined on the sample, it speaks as its own voice.";
    else if (voice.refinement === "failed") {
      words = `instant voice (as ${voice.instant}); the refinement failed: ${voice.refinement_error || "no reason given"}`;
    } else words = `instant voice (as ${voice.instant}), speaking now; refinement ${voice.refinement || "pending"}…`;
    $("cv-stage").textContent = words;
  }

  function forgetCustomVoice() {
    if (stopFollowing !== null) stopFollowing();
    stopFollowing = null;
    cvVoiceId = null;
    cvBox.hidden = true;
  }

  function follow(voice) {
    if (stopFollowing !== null) stopFollowing();
    cvVoiceId = voice.id;
    renderStage(voice);
    const answer = async (current) => {
      renderStage(current);
      const final = current.stage === "adapted" || current.refinement === "failed" || !current.refinement;
      if (final) await loadVoices(current.id);
      return final;
    };
    const refused = (message) => show(cvError, `Could not follow voice ${voice.id}: ${message}`);
    const lost = (reason) => { $("cv-stage").textContent = `lost contact with the server; retrying… (${reason})`; };
    stopFollowing = pollUntil(`v1/audio/voices/${encodeURIComponent(voice.id)}`, answer, refused, lost);
  }

  $("cv-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    show(cvError, "");
    const problem = checkCustomVoice();
    if (problem) return show(cvError, problem);
    const name = $("cv-name").value.trim();
    const language = cvLanguage.value;
    cvCreate.disabled = true;
    try {
      if (!accepted || accepted.pick !== picked.consent || accepted.language !== language) {
        accepted = null;
        cvCreateStatus.textContent = "Checking the consent recording…";
        const consent = await postForm("v1/audio/voice_consents", { name, language, recording: picked.consent },
                                       "The consent recording was refused");
        accepted = { pick: picked.consent, language, id: consent.id };
      }
      cvCreateStatus.textContent = `Consent ${accepted.id} accepted; checking the sample…`;
      const voice = await postForm("v1/audio/voices", { name, consent: accepted.id, audio_sample: picked.sample },
                                   "The sample was refused");
      cvCreateStatus.textContent = `Consent ${accepted.id} accepted; voice ${voice.id} created.`;
      follow(voice);
      await loadVoices(voice.id);
    } catch (error) {
      cvCreateStatus.textContent = accepted ? `Consent ${accepted.id} accepted.` : "";
      show(cvError, error.message);
    } finally {
      cvCreate.disabled = false;
    }
  });

  // Speaks the text of the Speak form with the new voice (chosen there, so format and speed apply).
  $("cv-speak").addEventListener("click", () => {
    if (speakButton.disabled) return;   // an answer is on its way: one at a time, as the Speak button
    voiceSelect.value = cvVoiceId;
    showVoice();
    $("speak-form").requestSubmit();
    $("speak-heading").scrollIntoView({ behavior: "smooth" });
  });

  // -- start -----------------------------------------------------------------------------------------
  keyInput.value = storage("get", KEY_STORAGE);
  keyInput.addEventListener("change", () => {
    loadVoices();
    loadPhrases();
    const pending = storage("get", JOB_STORAGE);   // a job whose poll the last key was refused on: followed again
    if (pending && stopPolling === null) watch({ id: pending, voice: $("job-voice").textContent, status: "queued", progress: 0 });
  });
  $("refresh-voices").addEventListener("click", () => loadVoices());
  loadPhrases();
  loadVoices().then(() => {
    const pending = storage("get", JOB_STORAGE);   // a job still training when the page was last closed
    if (pending) watch({ id: pending, voice: "", status: "queued", progress: 0 });
  });
})();
