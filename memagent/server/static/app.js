// memagent's page: upload a document, start a reading job, follow its events, scrub each memory.
// Every piece of text from a document, a question or a model goes into the page with textContent
// (never innerHTML), so a document full of <script> is shown as the text it is.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { job: null, questions: [], timelines: [], chunks: [], lastSeq: -1, running: false, doc: null };
window.memagent = { events: [], state };  // read by the browser tests (arrival times, counts)

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function call(method, path, body, contentType) {
  const init = { method, headers: headers(contentType ? { "Content-Type": contentType } : {}) };
  if (body !== undefined) init.body = body;
  const res = await fetch(path, init);
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  if (!res.ok) {
    const msg = data && data.error ? data.error.message : res.status + " " + res.statusText;
    throw new Error(msg);
  }
  return data;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function showError(msg) { $("error").textContent = msg || ""; }

async function loadConfig() {
  try {
    const c = await call("GET", "/api/config");
    $("model").textContent = "model: " + (c.model || "?");
    $("chunk-tokens").value = c.defaults.chunk_tokens;
    $("memory-tokens").value = c.defaults.memory_tokens;
    $("chunk-snap").value = c.defaults.chunk_snap;
    for (const [id, values, chosen] of [["template", c.templates, c.defaults.template],
                                         ["skip-update", c.skip_update, c.defaults.skip_update]]) {
      const sel = $(id);
      sel.replaceChildren(...values.map((v) => { const o = el("option", v); o.value = v; return o; }));
      sel.value = chosen;
    }
    showError("");
    return true;
  } catch (e) {
    showError("Cannot reach the server's API: " + e.message);
    return false;
  }
}

// ---- starting a read ---------------------------------------------------------------------------
async function start() {
  showError("");
  const questions = $("questions").value.split("\n").map((q) => q.trim()).filter((q) => q);
  if (!questions.length) return showError("Type at least one question.");
  const file = $("file").files[0];
  const text = $("doc").value;
  if (!file && !text.trim()) return showError("Paste a document or choose a file.");
  $("start").disabled = true;
  try {
    setStatus("Uploading the document…");
    const doc = await call("POST", "/api/documents", file || new Blob([text], { type: "text/plain" }),
                           "application/octet-stream");
    const body = { document: doc.id, questions,
                   chunk_tokens: parseInt($("chunk-tokens").value, 10) || undefined,
                   memory_tokens: parseInt($("memory-tokens").value, 10) || undefined,
                   template: $("template").value || undefined, skip_update: $("skip-update").value || undefined,
                   chunk_snap: $("chunk-snap").value === "" ? undefined : parseInt($("chunk-snap").value, 10) };
    const job = await call("POST", "/api/jobs", JSON.stringify(body), "application/json");
    history.replaceState(null, "", "#job=" + job.id);
    await follow(job);
  } catch (e) {
    showError(e.message);
    $("start").disabled = false;
  }
}

function reset(job) {
  state.job = job; state.questions = job.questions; state.lastSeq = -1; state.chunks = []; state.doc = job.document;
  state.timelines = job.questions.map(() => []);
  $("chunk-log").replaceChildren(); $("answers").replaceChildren(); $("panels").replaceChildren();
  $("bar").value = 0;
  const tpl = $("panel-template");
  job.questions.forEach((q, qi) => {
    const panel = tpl.content.firstElementChild.cloneNode(true);
    panel.dataset.question = qi;
    panel.querySelector(".question").textContent = "Q" + (qi + 1) + ": " + q;
    const slider = panel.querySelector(".timeline");
    slider.addEventListener("input", () => showPoint(qi, parseInt(slider.value, 10)));
    panel.querySelector(".chunk-details").addEventListener("toggle", () => loadChunkText(qi));
    $("panels").appendChild(panel);
  });
}

async function follow(job) {
  reset(job);
  state.running = true;
  $("cancel").disabled = false;
  $("download-trace").disabled = false;
  setStatus("Reading…");
  for (let attempt = 0; attempt < 50 && state.running; attempt++) {
    try {
      await streamEvents(job.id);
    } catch (e) {
      if (!state.running) break;
      setStatus("Connection lost; reconnecting…");
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  $("start").disabled = false;
  $("cancel").disabled = true;
}

// Server-sent events read with fetch (EventSource cannot send the Authorization header).
async function streamEvents(jobId) {
  const res = await fetch("/api/jobs/" + jobId + "/events?after=" + state.lastSeq, { headers: headers() });
  if (!res.ok) { state.running = false; throw new Error("events: " + res.status); }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
      let type = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) type = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(type, JSON.parse(data));
    }
  }
  if (state.running) throw new Error("stream ended early");
}

function onEvent(type, e) {
  window.memagent.events.push({ type, seq: e.seq, received: Date.now(), sent: e.time ? e.time * 1000 : null });
  if (type === "end") { state.running = false; return; }
  if (e.seq !== undefined) state.lastSeq = Math.max(state.lastSeq, e.seq);
  if (type === "start") setStatus(e.resumed ? "Resumed after chunk " + e.chunks_done + "…" : "Reading…");
  else if (type === "chunk") onChunk(e);
  else if (type === "done") onDone(e);
  else if (type === "failed") { setStatus("Failed: " + e.error); state.running = false; }
  else if (type === "cancelled") { setStatus("Cancelled."); state.running = false; }
}

function setStatus(text) { $("status").textContent = text; }

function onChunk(e) {
  state.chunks.push(e);
  const updated = e.questions.filter((q) => q.step === "update").length;
  const skipped = e.questions.filter((q) => q.step === "skip").length;
  const of = e.chunks_estimate ? " of ~" + e.chunks_estimate : "";
  const li = el("li", "chunk " + (e.chunk + 1) + of + " · " + (e.tokens ?? "?") + " tokens · " + updated + " updated"
                + (skipped ? ", " + skipped + " skipped" : "") + " · " + (e.seconds || 0).toFixed(2) + " s",
                "chunk" + (updated ? "" : " skip"));
  li.dataset.chunk = e.chunk;
  $("chunk-log").appendChild(li);
  li.scrollIntoView({ block: "nearest" });
  if (e.fraction !== null && e.fraction !== undefined) $("bar").value = e.fraction;
  setStatus("Reading: chunk " + (e.chunk + 1) + of + " done (" + (e.seconds || 0).toFixed(1) + " s)");
  e.questions.forEach((step, qi) => {
    const points = state.timelines[qi];
    const prev = points.length ? points[points.length - 1].memory : "";
    points.push({ chunk: e.chunk, step: step.step, memory: step.memory, prev, changed: step.changed,
                  start: e.start_char, end: e.end_char, error: step.error });
    const panel = panelOf(qi);
    const slider = panel.querySelector(".timeline");
    const atEnd = parseInt(slider.value, 10) >= points.length - 2;
    slider.max = points.length - 1;
    if (atEnd) { slider.value = points.length - 1; showPoint(qi, points.length - 1); }
    else showPosition(qi);
    const skips = points.filter((p) => p.step === "skip").map((p) => p.chunk + 1);
    panel.querySelector(".skipped").textContent = skips.length ? "Skipped chunks (no call): " + skips.join(", ") : "";
  });
}

function panelOf(qi) { return $("panels").children[qi]; }

function showPosition(qi) {
  const panel = panelOf(qi), points = state.timelines[qi];
  const i = parseInt(panel.querySelector(".timeline").value, 10);
  panel.querySelector(".position").textContent = points.length ? "after chunk " + (points[i].chunk + 1) + " of " + points.length : "";
}

function showPoint(qi, i) {
  const panel = panelOf(qi), p = state.timelines[qi][i];
  if (!p) return;
  showPosition(qi);
  const what = { update: p.changed ? "updated by this chunk" : "rewritten by this chunk, unchanged",
                 skip: "chunk skipped by the gate (no call); memory kept",
                 idle: "question stopped reading", error: "call failed: " + (p.error || "") }[p.step] || p.step;
  panel.querySelector(".step").textContent = "Chunk " + (p.chunk + 1) + ": " + what;
  panel.querySelector(".memory").textContent = p.memory;
  renderDiff(panel.querySelector(".diff"), p.prev, p.memory);
  const details = panel.querySelector(".chunk-details");
  details.dataset.point = i;
  if (details.open) loadChunkText(qi);
}

async function loadChunkText(qi) {
  const panel = panelOf(qi), details = panel.querySelector(".chunk-details");
  if (!details.open) return;
  const p = state.timelines[qi][parseInt(details.dataset.point || "0", 10)];
  if (!p) return;
  const pre = panel.querySelector(".chunk-text");
  try {
    const r = await call("GET", "/api/documents/" + state.doc + "/text?start=" + p.start + "&end=" + p.end);
    pre.textContent = r.text;  // document text: always as text
  } catch (e) { pre.textContent = "(cannot load the chunk: " + e.message + ")"; }
}

// Word-level diff (longest common subsequence); long memories fall back to showing the new text.
function renderDiff(target, before, after) {
  const a = before.split(/(\s+)/), b = after.split(/(\s+)/);
  target.replaceChildren();
  if (a.length * b.length > 4e6) { target.textContent = after; return; }
  const n = a.length, m = b.length, L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
    L[i][j] = a[i] === b[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  let i = 0, j = 0;
  const out = [];
  const push = (tag, t) => {
    const last = out[out.length - 1];
    if (last && last.tag === tag) last.text += t; else out.push({ tag, text: t });
  };
  while (i < n || j < m) {
    if (i < n && j < m && a[i] === b[j]) { push("", a[i]); i++; j++; }
    else if (j < m && (i >= n || L[i][j + 1] >= L[i + 1][j])) { push("ins", b[j]); j++; }
    else { push("del", a[i]); i++; }
  }
  for (const part of out) target.appendChild(part.tag ? el(part.tag, part.text) : document.createTextNode(part.text));
}

function onDone(e) {
  state.running = false;
  $("bar").value = 1;
  setStatus("Done: " + state.chunks.length + " chunk(s) read in " + e.seconds.toFixed(2) + " s.");
  const list = $("answers");
  list.replaceChildren();
  e.answers.forEach((a) => {
    const li = el("li", null, "answer-item");
    li.appendChild(el("div", a.question, "q"));
    li.appendChild(el("div", a.answer !== null ? a.answer : "(no answer: " + a.error + ")", "a"));
    li.appendChild(el("div", a.chunks + " chunks, " + a.calls + " calls, " + a.skipped_chunks + " skipped"
                      + (a.warnings && a.warnings.length ? " · warning: " + a.warnings.join("; ") : ""), "meta"));
    list.appendChild(li);
  });
}

async function cancel() {
  if (!state.job) return;
  try { await call("POST", "/api/jobs/" + state.job.id + "/cancel"); } catch (e) { showError(e.message); }
}

async function downloadTrace() {
  if (!state.job) return;
  try {
    const res = await fetch("/api/jobs/" + state.job.id + "/trace", { headers: headers() });
    if (!res.ok) throw new Error("trace: " + res.status);
    const url = URL.createObjectURL(await res.blob());
    const a = el("a");
    a.href = url; a.download = "trace-" + state.job.id + ".jsonl";
    document.body.appendChild(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (e) { showError(e.message); }
}

async function reattach() {
  const m = /job=([0-9a-f]{32})/.exec(location.hash);
  if (!m) return;
  try { await follow(await call("GET", "/api/jobs/" + m[1])); } catch (e) { showError(e.message); }
}

document.addEventListener("DOMContentLoaded", async () => {
  $("api-key").value = sessionStorage.getItem("memagent-key") || "";
  $("api-key").addEventListener("change", () => { sessionStorage.setItem("memagent-key", $("api-key").value); loadConfig(); });
  $("start").addEventListener("click", start);
  $("cancel").addEventListener("click", cancel);
  $("download-trace").addEventListener("click", downloadTrace);
  $("file").addEventListener("change", () => {
    const f = $("file").files[0];
    $("file-info").textContent = f ? f.name + " (" + f.size + " bytes)" : "";
  });
  if (await loadConfig()) await reattach();
});
