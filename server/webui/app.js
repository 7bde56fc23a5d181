// HAMburger's chat page: streams /v1/chat/completions and shades each macro
// step. Every text chunk of the stream carries a non-standard `hamburger`
// object, {tokens, macro_steps}: the tokens and macro steps its text covers
// (one step, unless text was held back for a possible stop string). The last
// chunk's `timings` gives the server's own figures.
"use strict";

const $ = (id) => document.getElementById(id);
/** The conversation so far, as the API takes it (the system prompt apart). */
let history = [];
/** Aborts the answer being streamed. */
let controller = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function addMessage(role, text) {
  const li = document.createElement("li");
  li.className = "msg " + role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Assistant";
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text;
  li.append(who, content);
  $("messages").append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}

function setStats(tokens, steps, seconds, final) {
  $("stat-tokens").textContent = String(tokens);
  $("stat-steps").textContent = String(steps);
  $("stat-per-step").textContent = steps > 0 ? (tokens / steps).toFixed(2) : "\u2013";
  const speed = final ?? (seconds > 0 ? tokens / seconds : null);
  $("stat-speed").textContent = speed === null ? "\u2013" : speed.toFixed(1);
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

/** Splits a Server-Sent Events buffer into complete events' data; returns the rest. */
function takeEvents(buffer, onData) {
  buffer = buffer.replace(/\r\n/g, "\n");
  let end;
  while ((end = buffer.indexOf("\n\n")) >= 0) {
    const event = buffer.slice(0, end);
    buffer = buffer.slice(end + 2);
    const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
    if (data) onData(data);
  }
  return buffer;
}

async function send(text) {
  showError("");
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const li = addMessage("assistant", "");
  li.dataset.state = "streaming";
  li.setAttribute("aria-busy", "true");
  const content = li.querySelector(".content");
  const meta = document.createElement("div");
  meta.className = "meta";
  li.append(meta);

  const system = $("system").value.trim();
  const messages = (system ? [{ role: "system", content: system }] : []).concat(history);
  const body = {
    messages,
    stream: true,
    temperature: Number($("temperature").value),
    confidence: Number($("confidence").value),
    max_tokens: Number($("max-tokens").value),
  };
  let tokens = 0, steps = 0, chunks = 0, first = null, answer = "";
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  setStats(0, 0, 0, null);
  const onData = (data) => {
    if (data === "[DONE]") return;
    const obj = JSON.parse(data);
    if (obj.error) throw new Error(obj.error.message);
    const delta = obj.choices?.[0]?.delta?.content;
    if (delta) {
      first ??= performance.now();
      const span = document.createElement("span");
      const k = obj.hamburger?.tokens ?? 0, n = obj.hamburger?.macro_steps ?? 0;
      span.className = "step s" + (chunks++ % 2) + (k > n ? " multi" : "");
      span.dataset.tokens = String(k);
      span.dataset.steps = String(n);
      span.title = k + (k === 1 ? " token" : " tokens") + (n > 1 ? " in " + n + " macro steps" : " in one macro step");
      span.textContent = delta;
      content.append(span);
      answer += delta;
      tokens += k;
      steps += n;
      setStats(tokens, steps, (performance.now() - first) / 1000, null);
      li.scrollIntoView({ block: "end" });
    }
    if (obj.timings) {
      const t = obj.timings;
      setStats(t.predicted_n, t.macro_steps, 0, t.predicted_per_second);
      meta.textContent = `${t.predicted_n} tokens in ${t.macro_steps} macro steps (${t.tokens_per_step.toFixed(2)} per step), ${t.predicted_per_second.toFixed(1)} tok/s`;
    }
  };
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!r.ok) {
      const e = await r.json().catch(() => null);
      throw new Error(e?.error?.message ?? `HTTP ${r.status}`);
    }
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer = takeEvents(buffer + value, onData);
    }
    li.dataset.state = "done";
  } catch (e) {
    li.dataset.state = e.name === "AbortError" ? "stopped" : "error";
    if (e.name !== "AbortError") showError("The answer failed: " + e.message);
  } finally {
    if (answer) history.push({ role: "assistant", content: answer });
    else history.pop();
    li.removeAttribute("aria-busy");
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    $("prompt").focus();
  }
}

function bindRange(id) {
  const show = () => { $(id + "-value").textContent = $(id).value; };
  $(id).addEventListener("input", show);
  show();
}

// A setting a person (or a script) has changed keeps its value; the others
// start at the server's defaults.
function markTouched(id) {
  $(id).addEventListener("input", () => { $(id).dataset.touched = "1"; });
}

function setDefault(id, value) {
  const e = $(id);
  if (value === undefined || value === null || e.dataset.touched) return;
  e.value = value;
  const shown = $(id + "-value");
  if (shown) shown.textContent = e.value;
}

document.addEventListener("DOMContentLoaded", () => {
  bindRange("temperature");
  bindRange("confidence");
  ["temperature", "confidence", "max-tokens"].forEach(markTouched);
  // The sliders start at what a request that sets nothing gets (llama-server's /props).
  fetch("/props", { headers: headers() })
    .then((r) => r.json())
    .then((p) => {
      const d = p.default_generation_settings?.params ?? {};
      setDefault("temperature", d.temperature);
      setDefault("confidence", d.confidence);
      if (d.n_predict > 0) setDefault("max-tokens", d.n_predict);
    })
    .catch(() => {});
  fetch("/v1/models", { headers: headers() })
    .then((r) => r.json())
    .then((m) => { $("model").textContent = m.data[0].id + " \u00b7 up to " + m.data[0].meta.max_steps + " tokens per macro step"; })
    .catch(() => {});
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("new-chat").addEventListener("click", () => {
    controller?.abort();
    history = [];
    $("messages").replaceChildren();
    setStats(0, 0, 0, null);
    showError("");
  });
});
