/* edgespec kiosk page.
 *
 * Plain script, no build step and no dependencies: it has to run from the Python package on a
 * machine with no network, for months, on a small touch screen. It talks to the server only
 * through the public HTTP API (the same one any kiosk app would use), so it doubles as the
 * reference client:
 *
 *   GET  /ready                 200 when the model is loaded (503 while loading); polled for the
 *                               "reconnecting" state
 *   GET  /v1/models             {data: [{id}]}: the model name sent with each request
 *   POST /v1/chat/completions   {model, messages, stream: true, max_tokens, temperature}
 *                               -> server-sent events "data: {chunk}" ... "data: [DONE]";
 *                               chunk.choices[0].delta.content is the text; the last chunk also
 *                               carries `usage` and `edgespec` (tokens/s, acceptance rate; with
 *                               `serve --docs`, the answer's `sources`, listed under it)
 *
 * Stopping an answer = aborting the fetch; the server cancels generation when the client goes.
 * With an API key on the server the page sends no key: serving the page to a browser on the device
 * set a session cookie that the API accepts in its place (apiFetch renews it when the server was
 * restarted).
 * Every turn sends the whole conversation: the engine reuses the cached prefix, so this is cheap.
 *
 * Settings come from the page URL (the kiosk unit sets them), for example
 *   /?max_turns=10&max_tokens=256&idle_reset=300&title=Museum%20guide&system=Answer%20briefly.
 */
"use strict";

(() => {
  // ---------------------------------------------------------------- settings from the URL
  const params = new URLSearchParams(window.location.search);
  const settingProblems = [];

  /** A number setting from the URL; a bad value is reported on the page (not silently ignored). */
  function numberParam(name, fallback, min, max, integer) {
    const raw = params.get(name);
    if (raw === null || raw === "") return fallback;
    const value = Number(raw);
    const kind = integer ? "a whole number" : "a number";
    if (!Number.isFinite(value) || (integer && !Number.isInteger(value)) || value < min || value > max) {
      settingProblems.push(`Ignored ${name}=${raw}: expected ${kind} from ${min} to ${max}; using ${fallback}.`);
      return fallback;
    }
    return value;
  }

  const config = {
    // Completed question/answer pairs kept on screen and sent as context; older ones are dropped so
    // that memory (page and prompt) stays bounded on a kiosk that runs for months.
    maxTurns: numberParam("max_turns", 20, 1, 500, true),
    maxTokens: numberParam("max_tokens", 512, 1, 32768, true),
    temperature: numberParam("temperature", 0, 0, 2, false),
    // Seconds without a touch or key press after which the conversation is cleared for the next
    // visitor; 0 turns it off.
    idleResetS: numberParam("idle_reset", 0, 0, 86400, true),
    title: (params.get("title") || "").slice(0, 80),
    system: (params.get("system") || "").slice(0, 4000),
    model: params.get("model") || "",
  };
  const urlSystem = config.system !== "";

  const POLL_READY_MS = 5000; // while the server is up: a cheap GET /ready
  const POLL_DOWN_MIN_MS = 500; // after a failure: retry quickly, backing off to POLL_DOWN_MAX_MS
  const POLL_DOWN_MAX_MS = 4000;
  const POLL_TIMEOUT_MS = 4000;
  // An answer that produces no bytes for this long is treated as lost. Long enough for a slow
  // board to prefill a long conversation, short enough that a hung server does not freeze the page.
  const STALL_TIMEOUT_MS = 120000;

  // ---------------------------------------------------------------- elements
  const $ = (id) => document.getElementById(id);
  const els = {
    title: $("title"),
    model: $("model"),
    newButton: $("new"),
    banner: $("banner"),
    log: $("log"),
    welcome: $("welcome"),
    form: $("composer"),
    input: $("input"),
    send: $("send"),
    stop: $("stop"),
    status: $("status"),
  };

  // ---------------------------------------------------------------- state
  /** @typedef {{id:number, question:string, answer:string, state:string, note:string,
   *             stats:object|null, el:HTMLElement, answerEl:HTMLElement, noteEl:HTMLElement}} Turn */
  /** @type {Turn[]} */
  let turns = [];
  let nextTurnId = 1;
  /** The request in flight: {turn, controller, reason} ; reason is set when we abort on purpose. */
  let active = null;
  let server = { state: "connecting", model: config.model };
  let pollTimer = null;
  let downDelay = POLL_DOWN_MIN_MS;
  let lastActivity = Date.now();
  let trimmedNotice = null;
  let wasReady = false; // "Reconnected" only after the server had been up once

  // ---------------------------------------------------------------- server state
  function setServerState(state) {
    const previous = server.state;
    server.state = state;
    document.body.dataset.server = state;
    const banner = els.banner;
    if (state === "ready") {
      banner.hidden = true;
      banner.textContent = "";
      if (previous !== "ready" && !active) setStatus(wasReady ? "Reconnected. Ready." : "Ready.");
      wasReady = true;
    } else {
      banner.hidden = false;
      banner.className = "banner " + state;
      banner.textContent =
        state === "loading"
          ? "The assistant is starting up… please wait."
          : state === "down"
            ? "Reconnecting to the assistant… your conversation is kept."
            : "Connecting to the assistant…";
    }
    updateControls();
  }

  function schedulePoll(ms) {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(poll, ms);
  }

  async function poll() {
    if (active) {
      // A streaming answer proves the server is alive; poll again once it ends.
      schedulePoll(POLL_READY_MS);
      return;
    }
    let next;
    try {
      const res = await fetch("/ready", { cache: "no-store", signal: AbortSignal.timeout(POLL_TIMEOUT_MS) });
      // 404: a server without /ready; it answered, so it is up.
      if (res.ok || res.status === 404) {
        if (res.ok && !urlSystem) {
          // the server's pinned system prompt (serve --system-prompt), when the URL sets none:
          // sending the same text lets every visitor reuse its prefilled cache
          const body = await res.json().catch(() => null);
          if (body && typeof body.system_prompt === "string") config.system = body.system_prompt;
        }
        if (server.state !== "ready" || !server.model) await loadModel();
        setServerState("ready");
        downDelay = POLL_DOWN_MIN_MS;
        next = POLL_READY_MS;
      } else {
        setServerState("loading");
        next = 1000;
      }
    } catch (err) {
      setServerState(server.state === "connecting" ? "connecting" : "down");
      next = downDelay;
      downDelay = Math.min(downDelay * 2, POLL_DOWN_MAX_MS);
    }
    schedulePoll(next);
  }

  /**
   * fetch() for the API (/v1/...). A server started with an API key admits this page by a session
   * cookie that serving the page sets (HttpOnly, SameSite=Strict, new each time the server starts):
   * on a 401 the page asks for itself once, which renews the cookie, and sends the request again.
   * A 401 after that is real (the page was not opened on the device itself) and is shown as such.
   */
  async function apiFetch(url, init) {
    const res = await fetch(url, init);
    if (res.status !== 401) return res;
    try {
      await fetch("/", { cache: "no-store", signal: init && init.signal });
    } catch (err) {
      return res;
    }
    return fetch(url, init);
  }

  async function loadModel() {
    if (config.model) {
      server.model = config.model;
    } else {
      try {
        const res = await apiFetch("/v1/models", { cache: "no-store", signal: AbortSignal.timeout(POLL_TIMEOUT_MS) });
        if (res.ok) {
          const body = await res.json();
          const first = body && Array.isArray(body.data) && body.data[0];
          if (first && typeof first.id === "string") server.model = first.id;
        }
      } catch (err) {
        /* keep the previous name; the next poll tries again */
      }
    }
    els.model.textContent = server.model || "";
  }

  // ---------------------------------------------------------------- conversation view
  function setStatus(text) {
    els.status.textContent = text;
  }

  function updateControls() {
    const busy = active !== null;
    els.send.hidden = busy;
    els.stop.hidden = !busy;
    els.send.disabled = busy || server.state !== "ready";
    document.body.dataset.busy = busy ? "yes" : "no";
  }

  function isNearBottom() {
    const log = els.log;
    return log.scrollHeight - log.scrollTop - log.clientHeight < 48;
  }

  function scrollToBottom() {
    els.log.scrollTop = els.log.scrollHeight;
  }

  function makeMessage(role, label) {
    const box = document.createElement("div");
    box.className = "msg " + role;
    const who = document.createElement("span");
    who.className = "sr-only";
    who.textContent = label;
    const body = document.createElement("div");
    body.className = "text";
    box.append(who, body);
    return { box, body };
  }

  /** @returns {Turn} */
  function addTurn(question) {
    els.welcome.hidden = true;
    const el = document.createElement("article");
    el.className = "turn";
    const user = makeMessage("user", "You: ");
    user.body.textContent = question;
    const assistant = makeMessage("assistant", "Assistant: ");
    const noteEl = document.createElement("p");
    noteEl.className = "note";
    noteEl.hidden = true;
    assistant.box.append(noteEl);
    el.append(user.box, assistant.box);
    els.log.append(el);
    const turn = {
      id: nextTurnId++,
      question,
      answer: "",
      state: "pending",
      note: "",
      stats: null,
      el,
      answerEl: assistant.body,
      boxEl: assistant.box,
      noteEl,
    };
    el.dataset.turn = String(turn.id);
    turns.push(turn);
    capTurns();
    scrollToBottom();
    return turn;
  }

  /** Drops the oldest turns beyond max_turns, from the screen and from the context sent. */
  function capTurns() {
    let dropped = 0;
    while (turns.length > config.maxTurns) {
      const old = turns.shift();
      old.el.remove();
      dropped += 1;
    }
    if (dropped) showTrimmedNotice();
  }

  function dropOldestTurn() {
    const old = turns.shift();
    if (old) old.el.remove();
    showTrimmedNotice();
  }

  function showTrimmedNotice() {
    if (!trimmedNotice) {
      trimmedNotice = document.createElement("p");
      trimmedNotice.className = "trimmed";
      trimmedNotice.textContent = "Earlier messages were removed to keep the conversation short.";
    }
    els.log.prepend(trimmedNotice);
  }

  /** Renders text with ``` fences as code blocks. textContent only: model output is never HTML. */
  function renderText(target, text) {
    const parts = text.split("```");
    target.replaceChildren();
    parts.forEach((part, i) => {
      if (i % 2 === 0) {
        // the line break right after a closing fence is already the end of the code block
        if (i > 0 && part.startsWith("\n")) part = part.slice(1);
        if (part) {
          const span = document.createElement("span");
          span.textContent = part;
          target.append(span);
        }
      } else {
        const newline = part.indexOf("\n");
        // The first line of a fence is its language tag ("```python").
        let code = newline >= 0 && /^[\w+#.-]*$/.test(part.slice(0, newline)) ? part.slice(newline + 1) : part;
        if (code.endsWith("\n")) code = code.slice(0, -1);
        const pre = document.createElement("pre");
        const codeEl = document.createElement("code");
        codeEl.textContent = code;
        pre.append(codeEl);
        target.append(pre);
      }
    });
  }

  let renderPending = new Set();
  function scheduleRender(turn) {
    renderPending.add(turn);
    if (renderPending.size === 1) {
      requestAnimationFrame(() => {
        const follow = isNearBottom();
        for (const t of renderPending) renderText(t.answerEl, t.answer);
        renderPending = new Set();
        if (follow) scrollToBottom();
      });
    }
  }

  function setTurnState(turn, state, note) {
    turn.state = state;
    turn.note = note || "";
    turn.el.dataset.state = state;
    turn.boxEl.setAttribute("aria-busy", state === "streaming" || state === "pending" ? "true" : "false");
    turn.noteEl.textContent = turn.note;
    turn.noteEl.hidden = !turn.note;
    const follow = isNearBottom();
    renderText(turn.answerEl, turn.answer);
    renderPending.delete(turn);
    const retry = turn.el.querySelector("button.retry");
    if (retry) retry.remove();
    if (state === "error") {
      const button = document.createElement("button");
      button.type = "button";
      button.className = "retry secondary";
      button.textContent = "Try again";
      button.addEventListener("click", () => retryTurn(turn));
      turn.boxEl.append(button);
    }
    if (follow) scrollToBottom();
  }

  /**
   * Under an answer from the venue's documents (`serve --docs`): the passages it was given, numbered as
   * the answer cites them, with the page each comes from and the passage's own words quoted below it (a
   * touch screen has no hover). Text only, never HTML.
   */
  function showSources(turn, sources) {
    const old = turn.boxEl.querySelector(".sources");
    if (old) old.remove();
    if (!Array.isArray(sources) || sources.length === 0) return;
    const box = document.createElement("section");
    box.className = "sources";
    box.setAttribute("aria-label", "Sources");
    const head = document.createElement("p");
    head.className = "sources-head";
    head.textContent = "Sources";
    const list = document.createElement("ol");
    for (const s of sources) {
      if (!s || typeof s !== "object") continue;
      const item = document.createElement("li");
      const file = String(s.file || "").split(/[\\/]/).pop();
      const name = document.createElement("span");
      name.textContent = `[${s.id}] ${s.title || file}` + (file ? ` — ${file}` : "");
      item.append(name);
      item.title = `${s.file || ""}, characters ${s.start}–${s.end}`;
      if (typeof s.text === "string" && s.text.trim()) {
        const quote = document.createElement("blockquote");
        quote.className = "source-text";
        const text = s.text.trim();
        quote.textContent = text.length > 400 ? text.slice(0, 400) + "…" : text;
        item.append(quote);
      }
      list.append(item);
    }
    box.append(head, list);
    turn.boxEl.append(box);
    if (isNearBottom()) scrollToBottom();
  }

  // ---------------------------------------------------------------- requests
  /** The messages for a request: system prompt, every answered turn before `turn`, then its question. */
  function buildMessages(turn) {
    const messages = [];
    if (config.system) messages.push({ role: "system", content: config.system });
    for (const t of turns) {
      if (t === turn) break;
      // Failed turns and empty answers are shown but not sent: the model never saw them complete.
      if ((t.state === "done" || t.state === "stopped") && t.answer) {
        messages.push({ role: "user", content: t.question });
        messages.push({ role: "assistant", content: t.answer });
      }
    }
    messages.push({ role: "user", content: turn.question });
    return messages;
  }

  class HttpError extends Error {
    constructor(status, message, param, code, retryAfter) {
      super(message);
      this.status = status;
      this.param = param;
      this.code = code;
      this.retryAfter = retryAfter;
    }
  }

  class StreamError extends Error {}

  async function readHttpError(res) {
    let message = "";
    let param = null;
    let code = null;
    try {
      const body = await res.json();
      const e = body && (body.error || body);
      if (e && typeof e === "object") {
        message = typeof e.message === "string" ? e.message : "";
        param = e.param || null;
        code = e.code || e.type || null;
      }
    } catch (err) {
      /* not JSON: keep the status only */
    }
    return new HttpError(res.status, message, param, code, res.headers.get("Retry-After"));
  }

  function isContextTooLong(err) {
    if (!(err instanceof HttpError) || err.status !== 400) return false;
    if (err.code === "context_length_exceeded") return true;
    return (err.param === "messages" || err.param === "prompt") && /too long|cache holds|context/i.test(err.message);
  }

  /** Reads the server-sent events of one answer into `turn`. Resolves with the final chunk's info. */
  async function readStream(res, turn, controller) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let dataLines = [];
    let sawDone = false;
    const info = { finishReason: null, usage: null, stats: null };
    let stallTimer = null;
    const armStall = () => {
      clearTimeout(stallTimer);
      stallTimer = setTimeout(() => {
        active && active.controller === controller && (active.reason = "stall");
        controller.abort();
      }, STALL_TIMEOUT_MS);
    };

    const handleEvent = (data) => {
      if (data === "[DONE]") {
        sawDone = true;
        return;
      }
      let chunk;
      try {
        chunk = JSON.parse(data);
      } catch (err) {
        return; // a comment or keep-alive we do not understand: skip it, keep reading
      }
      if (chunk.error) {
        throw new StreamError((chunk.error && chunk.error.message) || "the server reported an error");
      }
      const choice = chunk.choices && chunk.choices[0];
      if (choice) {
        const delta = choice.delta && choice.delta.content;
        if (typeof delta === "string" && delta) {
          turn.answer += delta;
          if (turn.state !== "streaming") setTurnState(turn, "streaming");
          scheduleRender(turn);
        }
        if (choice.finish_reason) info.finishReason = choice.finish_reason;
      }
      if (chunk.usage) info.usage = chunk.usage;
      if (chunk.edgespec) info.stats = chunk.edgespec;
    };

    armStall();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        armStall();
        buffer += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          let line = buffer.slice(0, nl);
          buffer = buffer.slice(nl + 1);
          if (line.endsWith("\r")) line = line.slice(0, -1);
          if (line === "") {
            if (dataLines.length) handleEvent(dataLines.join("\n"));
            dataLines = [];
          } else if (line.startsWith("data:")) {
            dataLines.push(line.slice(line[5] === " " ? 6 : 5));
          }
          if (sawDone) break;
        }
        if (sawDone) break;
      }
      if (dataLines.length) handleEvent(dataLines.join("\n"));
    } finally {
      clearTimeout(stallTimer);
    }
    if (sawDone) {
      reader.cancel().catch(() => {});
    } else {
      throw new StreamError("the answer ended before it was complete");
    }
    return info;
  }

  function formatStats(info) {
    const parts = [];
    const s = info.stats || {};
    const tps = s.tokens_per_second ?? s.decode_tokens_per_second;
    if (typeof tps === "number" && Number.isFinite(tps)) parts.push(`${tps.toFixed(1)} tokens/s`);
    let acc = s.acceptance_rate;
    if (typeof acc !== "number" && typeof s.drafted === "number" && s.drafted > 0) acc = s.accepted / s.drafted;
    if (typeof acc === "number" && Number.isFinite(acc)) parts.push(`acceptance ${Math.round(acc * 100)}%`);
    else if (s.drafter === "none") parts.push("no drafting");
    const tokens = (info.usage && info.usage.completion_tokens) ?? s.new_tokens;
    if (typeof tokens === "number") parts.push(`${tokens} tokens`);
    const ttft = s.ttft_s;
    if (typeof ttft === "number" && Number.isFinite(ttft)) parts.push(`first token ${ttft.toFixed(2)} s`);
    return parts.join(" · ");
  }

  function finishNote(reason) {
    if (reason === "length") return "The answer was cut at the length limit.";
    if (reason === "cache_full") return "The conversation filled the model's memory. Start a new conversation to continue.";
    return "";
  }

  /** A friendly sentence for a failed request. The conversation itself is never touched. */
  function describeFailure(err, reason) {
    if (reason === "stall") return "The assistant stopped responding. It will reconnect by itself; press Try again.";
    if (err instanceof HttpError) {
      if (err.status === 429) {
        const wait = err.retryAfter ? ` in about ${err.retryAfter} s` : " in a moment";
        return `The assistant is busy with other questions. Please try again${wait}.`;
      }
      if (err.status === 503) return "The assistant is starting up or restarting. Please try again in a moment.";
      if (err.status === 400 || err.status === 413 || err.status === 422) {
        if (isContextTooLong(err)) return "Your question is too long for this assistant. Please shorten it.";
        return "The assistant could not take this question" + (err.message ? `: ${err.message}` : ".");
      }
      if (err.status === 401 || err.status === 403) {
        return "This page is not allowed to use the assistant: the server asks for an API key, and admits the page without one only in a browser on the device itself.";
      }
      return `Something went wrong on the assistant's side (error ${err.status}). Please try again.`;
    }
    if (err instanceof StreamError) {
      return `The answer was interrupted (${err.message}). Please try again.`;
    }
    return "The connection to the assistant was lost. It will reconnect by itself; your conversation is kept.";
  }

  async function runTurn(turn) {
    const controller = new AbortController();
    active = { turn, controller, reason: null };
    turn.answer = "";
    setTurnState(turn, "pending");
    updateControls();
    setStatus("Thinking…");
    let info = null;
    let failure = null;
    for (;;) {
      try {
        const res = await apiFetch("/v1/chat/completions", {
          method: "POST",
          headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
          body: JSON.stringify({
            model: server.model || undefined,
            messages: buildMessages(turn),
            stream: true,
            max_tokens: config.maxTokens,
            temperature: config.temperature,
          }),
          signal: controller.signal,
          cache: "no-store",
        });
        if (!res.ok) throw await readHttpError(res);
        setStatus("Answering…");
        info = await readStream(res, turn, controller);
        break;
      } catch (err) {
        // Too long for the model's cache: drop the oldest turn and ask again, while there is one.
        if (isContextTooLong(err) && turns.indexOf(turn) > 0) {
          dropOldestTurn();
          continue;
        }
        failure = err;
        break;
      }
    }
    const reason = active.reason;
    active = null;
    if (reason === "stop") {
      setTurnState(turn, "stopped", "Stopped.");
      setStatus("Stopped.");
    } else if (reason === "new") {
      // the conversation was cleared; the turn is gone
    } else if (failure) {
      setTurnState(turn, "error", describeFailure(failure, reason));
      setStatus("The last answer failed; your conversation is kept.");
      if (!(failure instanceof HttpError)) {
        // The server is gone or broke off: show the reconnecting state right away.
        setServerState("down");
        downDelay = POLL_DOWN_MIN_MS;
      }
    } else {
      // edgespec's own finish reason is finer than OpenAI's ("cache_full" is sent as "length")
      const reason = (info && info.stats && info.stats.finish_reason) || (info && info.finishReason);
      const note = finishNote(reason) || (turn.answer ? "" : "The assistant gave an empty answer.");
      setTurnState(turn, "done", note);
      turn.stats = info;
      showSources(turn, info && info.stats && info.stats.sources);
      setStatus(formatStats(info) || "Done.");
    }
    updateControls();
    schedulePoll(server.state === "ready" ? POLL_READY_MS : 0);
  }

  function ask() {
    const question = els.input.value.trim();
    if (!question || active || server.state !== "ready") return;
    els.input.value = "";
    const turn = addTurn(question);
    runTurn(turn);
  }

  function retryTurn(turn) {
    if (active || server.state !== "ready" || turns.indexOf(turn) < 0) return;
    // Retrying an older failed turn moves it to the end, so it is answered with all context before it.
    turns.splice(turns.indexOf(turn), 1);
    turns.push(turn);
    els.log.append(turn.el);
    runTurn(turn);
    els.input.focus();
  }

  function stop(reason) {
    if (!active) return;
    active.reason = reason;
    active.controller.abort();
  }

  function newConversation() {
    stop("new");
    for (const t of turns) t.el.remove();
    turns = [];
    if (trimmedNotice) trimmedNotice.remove();
    els.welcome.hidden = false;
    setStatus(server.state === "ready" ? "New conversation. Ready." : "New conversation.");
    updateControls();
    els.input.value = "";
    els.input.focus();
  }

  // ---------------------------------------------------------------- input
  els.form.addEventListener("submit", (event) => {
    event.preventDefault();
    ask();
  });
  els.input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      ask();
    }
  });
  els.stop.addEventListener("click", () => {
    stop("stop");
    els.input.focus();
  });
  els.newButton.addEventListener("click", newConversation);
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && active) {
      event.preventDefault();
      stop("stop");
    } else if (event.altKey && (event.key === "n" || event.key === "N")) {
      event.preventDefault();
      newConversation();
    }
  });
  for (const type of ["pointerdown", "keydown", "wheel", "touchstart"]) {
    document.addEventListener(type, () => { lastActivity = Date.now(); }, { passive: true, capture: true });
  }
  if (config.idleResetS > 0) {
    setInterval(() => {
      if (!active && turns.length && Date.now() - lastActivity > config.idleResetS * 1000) newConversation();
    }, 1000);
  }

  // ---------------------------------------------------------------- start
  if (config.title) {
    els.title.textContent = config.title;
    document.title = config.title;
  }
  for (const problem of settingProblems) {
    const p = document.createElement("p");
    p.className = "trimmed setting-problem";
    p.textContent = problem;
    els.log.prepend(p);
  }
  setServerState("connecting");
  updateControls();
  els.input.focus();
  poll();
})();
