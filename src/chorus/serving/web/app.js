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
  }

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

  $("speak-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    show(speakError, "");
    const input = $("text").value;
    if (!input.trim()) return show(speakError, "Type some text to speak.");
    if (!voiceSelect.value) return show(speakError, "Choose a voice (none is listed: check the API key).");
    speakButton.disabled = true;
    speakStatus.textContent = "Synthesizing…";
    const started = performance.now();
    try {
      const response = await fetch("v1/audio/speech", {
        method: "POST",
        headers: authHeaders({ "Content-Type": "application/json" }),
        body: JSON.stringify({ model: "chorus", input, voice: voiceSelect.value, response_format: "wav",
                               speed: Number(speed.value) }),
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      const body = fixWavSizes(await response.arrayBuffer());
      const rate = Number(response.headers.get("X-Sample-Rate")) || 22050;
      if (audioUrl) URL.revokeObjectURL(audioUrl);
      audioUrl = URL.createObjectURL(new Blob([body], { type: "audio/wav" }));
      audio.src = audioUrl;
      const seconds = Math.max(0, body.byteLength - 44) / 2 / rate;
      speakStatus.textContent = `${seconds.toFixed(1)} s of audio from ${voiceSelect.value} in ` +
        `${((performance.now() - started) / 1000).toFixed(1)} s.`;
      audio.play().catch(() => { /* autoplay refused: the controls are there */ });
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
    if (!clipsInput.files.length) return "Choose the clips (or one zip archive).";
    if (!transcripts.value.trim()) return "Write a transcript line (filename|text) for each clip.";
    const named = transcriptNames(transcripts.value);
    const untranscribed = [...clipsInput.files].map((f) => f.name).filter((name) => !named.has(name));
    if (untranscribed.length) return `No transcript line for: ${untranscribed.join(", ")}.`;
    const empty = transcripts.value.split(/\r?\n/).filter((l) => l.includes("|") && !l.split("|").slice(1).join("|").trim());
    if (empty.length) return `Write the text after the '|' for: ${empty.map((l) => l.split("|")[0]).join(", ")}.`;
    return "";
  }

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
      form.append("transcripts", transcripts.value);
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
