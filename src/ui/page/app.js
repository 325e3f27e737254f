// The live view's script: one feed on /events, read as Server-Sent Events. Its first event is
// a snapshot (agents, tasks, what is queued or running, the questions waiting, and the CSRF
// token actions carry); then come the bridge's own events, the lines `aamp-bridge start
// --json` prints, in order.
// Text from the bridge only ever goes into the page as text (textContent), never as markup,
// and what senders and agents wrote is isolated (<bdi>) so that its direction marks cannot
// reorder the page's own words; in what a person approves, such marks are shown as <U+XXXX>.
// The access token comes in the link's fragment (never sent to any server), is kept in this
// tab's sessionStorage (this origin only, port included) and goes with each request as an
// Authorization header: never as a cookie, which the browser would send to every port of
// this host.
"use strict";

const TOKEN_KEY = "aamp-bridge-token";

function takeToken() {
  const found = /(?:^#|&)token=([0-9a-fA-F]{64})(?:&|$)/.exec(location.hash);
  if (found) {
    sessionStorage.setItem(TOKEN_KEY, found[1]);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

const TOKEN = takeToken();
const auth = () => ({ Authorization: "Bearer " + TOKEN });

const state = {
  csrf: "",
  nowOffset: 0, // the bridge's clock minus this one's
  agents: [],
  tasks: [], // the journal's rows, newest first
  active: new Map(), // agent \n taskId -> task under way (with its stream)
  questions: new Map(), // agent \n taskId -> question waiting
  usage: null, // today's and the last 24 hours' tokens and cost (the snapshot's `usage`)
};

const FINISHED_KEPT = 10; // finished tasks kept on the page with their stream
const HOURS = 3; // the charts' span
const BUCKET_MIN = 10; // minutes per bar

const $ = (id) => document.getElementById(id);
// What a sender or an agent wrote, isolated from the words around it.
const bdi = (text) => el("bdi", {}, text === undefined || text === null ? "" : String(text));

// Marks that change how text reads without being seen (direction overrides and isolates,
// zero-width and other format characters, controls other than newline and tab), shown as
// <U+XXXX> in anything a person approves. The bridge shows them so too; this is the same
// rule, for what the page itself puts together.
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\ufff9-\ufffb\u{e0000}-\u{e007f}]/gu;
const visible = (text) => String(text || "").replace(HIDDEN, (c) => "<U+" + c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0") + ">");
const key = (agent, taskId) => agent + "\n" + taskId;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function ms(text) {
  const t = Date.parse(text);
  return Number.isNaN(t) ? Date.now() + state.nowOffset : t;
}

function since(startMs) {
  const s = Math.max(0, Math.round((Date.now() + state.nowOffset - startMs) / 1000));
  return s < 60 ? s + " s" : s < 3600 ? Math.floor(s / 60) + " min " + (s % 60) + " s" : Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

function clock(msTime) {
  return new Date(msTime).toLocaleTimeString();
}

// ---- the feed ----

// EventSource cannot send a header, so the feed is read with fetch; it is tried again two
// seconds after it ends, as EventSource would.
async function connect() {
  if (!TOKEN) {
    setLink(false, "no access token: open the link `aamp-bridge ui` prints");
    return;
  }
  for (;;) {
    try {
      const response = await fetch("/events", { headers: auth(), cache: "no-store" });
      if (response.status === 401) {
        setLink(false, "wrong access token: open the link `aamp-bridge ui` prints");
        return;
      }
      if (!response.ok) throw new Error(response.statusText);
      setLink(true);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          onFrame(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
    } catch (_) {
      // Gone: tried again below.
    }
    setLink(false);
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

// One Server-Sent Event: `event:` names a snapshot, `data:` lines hold its JSON.
function onFrame(frame) {
  let name = "message";
  const data = [];
  for (const line of frame.split("\n")) {
    if (line.startsWith("event: ")) name = line.slice(7);
    else if (line.startsWith("data: ")) data.push(line.slice(6));
  }
  if (!data.length) return; // a keepalive comment
  const value = JSON.parse(data.join("\n"));
  if (name === "snapshot") onSnapshot(value);
  else onEvent(value);
}

function setLink(up, why) {
  const link = $("link");
  link.textContent = up ? "live" : why || "reconnecting…";
  link.className = "link " + (up ? "up" : "down");
}

function onSnapshot(snap) {
  setLink(true);
  state.csrf = snap.csrf;
  state.nowOffset = (snap.nowMs || Date.now()) - Date.now();
  state.agents = snap.agents || [];
  state.tasks = snap.tasks || [];
  sortRecent();
  const b = snap.bridge || {};
  $("bridge").textContent = "pid " + b.pid + " · version " + b.version + " · up since " + (b.startedAt || "?");
  // Tasks under way keep the stream this page saw; the rest come from the snapshot.
  const seen = new Set();
  for (const a of snap.active || []) {
    const k = key(a.agent, a.taskId);
    seen.add(k);
    const t = state.active.get(k) || newTask(a.agent, a.taskId, a.from, a.title, a.receivedAtMs);
    t.state = a.state === "running" || a.state === "help_needed" ? "running" : "queued";
    if (snap.resync) t.missed = true;
    state.active.set(k, t);
  }
  for (const [k, t] of state.active) {
    if (!seen.has(k) && !t.finished) state.active.delete(k);
  }
  state.questions = new Map((snap.questions || []).map((q) => [key(q.agent, q.taskId), q]));
  state.usage = snap.usage || null;
  renderUsage();
  renderAgents();
  renderActive();
  renderQuestions();
  renderRecent();
  renderCharts();
}

function newTask(agent, taskId, from, title, receivedMs) {
  return { agent, taskId, from, title, state: "queued", receivedMs, blocks: [], finished: false, node: null };
}

function onEvent(ev) {
  const k = key(ev.agent, ev.taskId);
  switch (ev.event) {
    case "task.received": {
      state.active.set(k, newTask(ev.agent, ev.taskId, ev.from, ev.title, ms(ev.time)));
      renderActive();
      renderAgents();
      break;
    }
    case "task.started": {
      const t = state.active.get(k);
      if (t) {
        t.state = "running";
        t.startedMs = ms(ev.time);
        drawTask(t);
        renderAgents();
      }
      break;
    }
    case "task.stream": {
      const t = state.active.get(k);
      if (t) {
        addToStream(t, ev.type, ev.payload || {});
      }
      break;
    }
    case "task.help_needed": {
      state.questions.set(k, { agent: ev.agent, taskId: ev.taskId, from: ev.from, question: ev.question, options: ev.options || [] });
      renderQuestions();
      break;
    }
    case "task.answered": {
      if (ev.taskId) state.questions.delete(key(ev.agent, ev.taskId));
      renderQuestions();
      break;
    }
    case "task.completed": {
      const t = state.active.get(k);
      if (t) {
        t.finished = true;
        t.state = ev.status;
        t.error = ev.error;
        t.durationMs = ev.durationMs;
        drawTask(t);
      }
      state.questions.delete(k);
      addRecent({
        agent: ev.agent, taskId: ev.taskId, sender: t ? t.from : "", title: t ? t.title : "", state: ev.status === "completed" ? "answered" : (ev.error || "").startsWith("cancelled") ? "cancelled" : "rejected",
        reason: ev.error, receivedAtMs: t ? t.receivedMs : ms(ev.time) - (ev.durationMs || 0), updatedAtMs: ms(ev.time),
      });
      pruneFinished();
      renderQuestions();
      renderAgents();
      renderRecent();
      renderCharts();
      if (ev.usage) refreshUsage();
      break;
    }
    case "task.rejected": {
      addRecent({ agent: ev.agent, taskId: ev.taskId, sender: ev.from, title: ev.title, state: "rejected", reason: ev.reason, receivedAtMs: ms(ev.time), updatedAtMs: ms(ev.time) });
      renderRecent();
      break;
    }
    case "bridge.stopping": {
      $("bridge").textContent = "the bridge is stopping";
      break;
    }
    default:
      break;
  }
}

// A finished task into the recent list: in place of the row the snapshot had for it (its
// row number and arrival kept), the list newest first by arrival.
function addRecent(row) {
  const i = state.tasks.findIndex((r) => r.agent === row.agent && r.taskId === row.taskId && r.sender === row.sender);
  if (i >= 0) {
    const old = state.tasks[i];
    state.tasks[i] = Object.assign({}, old, row, { id: old.id, receivedAtMs: old.receivedAtMs, title: old.title || row.title });
  } else {
    state.tasks.push(row);
  }
  sortRecent();
}

function sortRecent() {
  state.tasks.sort((a, b) => b.receivedAtMs - a.receivedAtMs || (b.id || Infinity) - (a.id || Infinity));
}

function pruneFinished() {
  const finished = [...state.active.values()].filter((t) => t.finished);
  for (const t of finished.slice(0, Math.max(0, finished.length - FINISHED_KEPT))) {
    state.active.delete(key(t.agent, t.taskId));
  }
  renderActive();
}

// ---- one task's stream, kept in the order it came ----

function addToStream(t, type, payload) {
  const last = t.blocks[t.blocks.length - 1];
  if (type === "text.delta") {
    if (last && last.type === "text") last.text += payload.text || "";
    else t.blocks.push({ type: "text", text: payload.text || "" });
  } else if (type === "tool_call") {
    const same = t.blocks.find((b) => b.type === "tool" && b.id === payload.toolCallId);
    if (same) Object.assign(same, { label: payload.label || same.label, status: payload.status, input: payload.input || same.input, output: payload.output || same.output });
    else t.blocks.push({ type: "tool", id: payload.toolCallId, label: payload.label, status: payload.status, input: payload.input, output: payload.output });
  } else if (type === "todo") {
    const list = t.blocks.find((b) => b.type === "todo");
    if (list) list.items = payload.items || [];
    else t.blocks.push({ type: "todo", items: payload.items || [] });
  } else if (type === "artifact") {
    t.blocks.push({ type: "artifact", filename: payload.filename, size: payload.size });
  }
  drawStream(t);
}

function drawStream(t) {
  if (!t.node) return;
  const box = t.node.querySelector(".stream");
  box.replaceChildren(
    ...(t.missed ? [el("p", { class: "quiet" }, "(this page missed part of the stream)")] : []),
    ...t.blocks.map((b) => {
      if (b.type === "text") return el("pre", { class: "text" }, bdi(b.text));
      if (b.type === "tool") {
        return el("div", { class: "tool " + (b.status || ""), "data-id": b.id || "" },
          el("div", {}, el("b", {}, bdi(b.label || "tool")), " ", el("span", { class: "state " + (b.status || "") }, b.status || "")),
          b.output ? el("pre", {}, bdi(b.output)) : null);
      }
      if (b.type === "todo") {
        return el("ul", { class: "todo" }, ...b.items.map((i) => el("li", { class: i.status || "" }, bdi(i.content || ""))));
      }
      return el("div", { class: "meta" }, "file ", bdi(b.filename), " (" + b.size + " bytes)");
    }),
  );
}

function drawTask(t) {
  if (!t.node) return;
  t.node.querySelector(".title").replaceChildren(bdi(t.title || t.taskId));
  const s = t.node.querySelector(".state");
  s.textContent = t.state;
  s.className = "state " + t.state;
  t.node.querySelector(".elapsed").textContent = t.finished
    ? "took " + Math.round((t.durationMs || 0) / 100) / 10 + " s"
    : since(t.startedMs || t.receivedMs);
  const err = t.node.querySelector(".error");
  err.replaceChildren(bdi(t.error || ""));
  t.node.querySelector("button.cancel").hidden = t.finished;
  drawStream(t);
}

function renderActive() {
  const box = $("active");
  const tasks = [...state.active.values()];
  $("no-active").hidden = tasks.length > 0;
  box.replaceChildren(...tasks.map((t) => {
    if (!t.node) {
      t.node = el("article", { class: "card task", "data-task": t.taskId, "data-agent": t.agent },
        el("h3", {}, el("span", { class: "title" }), " ", el("span", { class: "state" })),
        el("div", { class: "meta" }, bdi(t.agent), " · from ", bdi(t.from || "?"), " · ", el("span", { class: "elapsed" })),
        el("div", { class: "error" }),
        el("button", { class: "cancel", type: "button", onclick: () => cancelTask(t) }, "Cancel"),
        el("div", { class: "stream" }));
      drawTask(t);
    }
    return t.node;
  }));
}

setInterval(() => {
  for (const t of state.active.values()) {
    if (!t.finished && t.node) t.node.querySelector(".elapsed").textContent = since(t.startedMs || t.receivedMs);
  }
}, 1000);

// ---- agents ----

function today(agent) {
  const start = new Date();
  start.setHours(0, 0, 0, 0);
  const counts = {};
  for (const row of state.tasks) {
    if (row.agent === agent && row.receivedAtMs >= start.getTime()) counts[row.state] = (counts[row.state] || 0) + 1;
  }
  const parts = Object.entries(counts).map(([s, n]) => n + " " + s);
  return parts.length ? parts.join(", ") : "none";
}

function renderAgents() {
  $("agents").replaceChildren(...state.agents.map((a) => {
    const link = a.link || {};
    const slots = a.slots || {};
    const under = [...state.active.values()].filter((t) => t.agent === a.agent && !t.finished);
    const running = under.filter((t) => t.state === "running").length;
    const login = a.login ? (a.login.loggedIn ? "logged in" : ["not logged in: ", bdi(a.login.detail)]) : "no check for this agent";
    return el("article", { class: "card agent", "data-agent": a.agent },
      el("h3", {}, bdi(a.agent)),
      el("dl", {},
        el("dt", {}, "mailbox"), el("dd", { class: "mailbox" }, bdi(a.mailbox), " (" + (a.backend || "?") + ")"),
        el("dt", {}, "agent"), el("dd", {}, bdi(a.profile || "?")),
        el("dt", {}, "link"), el("dd", { class: "linkstate" }, (link.mailbox || "never connected") + (link.since ? " since " + link.since : "") + (a.reading ? ", push over " + a.reading : ", polling")),
        el("dt", {}, "login"), el("dd", {}, ...[].concat(login)),
        el("dt", {}, "slots"), el("dd", { class: "slots" }, running + " of " + (slots.maxConcurrent || "?") + " in use"),
        el("dt", {}, "queue"), el("dd", { class: "queue" }, String(under.length - running)),
        el("dt", {}, "today"), el("dd", { class: "today" }, today(a.agent)),
        el("dt", {}, "spent today"), el("dd", { class: "spent" }, spent(agentUsage(a.agent))),
        ...(a.quota ? [el("dt", {}, "quota"), el("dd", { class: "quota" }, "waiting for quota " + (a.quota.until ? "until " + a.quota.until : "(no reset stated; probing)") + ": ", bdi(a.quota.said || ""))] : []),
        ...(link.lastError ? [el("dt", {}, "last error"), el("dd", { class: "error" }, bdi(link.lastError))] : [])));
  }));
}

// ---- questions ----

function renderQuestions() {
  const qs = [...state.questions.values()];
  $("questions-section").hidden = qs.length === 0;
  $("questions").replaceChildren(...qs.map((q) => {
    const free = el("input", { type: "text", placeholder: "or answer in your words", "aria-label": "answer" });
    const note = el("div", { class: "error" });
    return el("article", { class: "card question", "data-task": q.taskId, "data-agent": q.agent },
      el("div", { class: "meta" }, bdi(q.agent), " · task ", bdi(q.taskId), " · from ", bdi(q.from)),
      el("p", { class: "asked" }, bdi(q.question ? visible(q.question) : "(no question text)")),
      ...q.options.map((o) => el("button", { class: "option", type: "button", onclick: () => answer(q, o, note) }, bdi(visible(o)))),
      el("div", {}, free, el("button", { type: "button", onclick: () => free.value.trim() && answer(q, free.value.trim(), note) }, "Send")),
      note);
  }));
}

// ---- actions: same-origin POSTs with the CSRF token from the feed ----

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: Object.assign(auth(), { "Content-Type": "application/json", "X-AAMP-CSRF": state.csrf }),
    body: JSON.stringify(body),
  });
  const text = await response.text();
  let reply = {};
  try { reply = JSON.parse(text); } catch (_) { reply = { ok: false, error: text.trim() }; }
  if (!response.ok || !reply.ok) throw new Error(reply.error || response.statusText);
}

async function answer(q, text, note) {
  note.textContent = "";
  try {
    await post("/api/answer", { agent: q.agent, from: q.from, taskId: q.taskId, answer: text });
    state.questions.delete(key(q.agent, q.taskId));
    renderQuestions();
  } catch (e) {
    note.replaceChildren("not answered: ", bdi(e.message));
  }
}

async function cancelTask(t) {
  const err = t.node.querySelector(".error");
  try {
    await post("/api/cancel", { agent: t.agent, from: t.from, taskId: t.taskId });
    err.textContent = "cancelling…";
  } catch (e) {
    err.replaceChildren("not cancelled: ", bdi(e.message));
  }
}

// ---- recent tasks and their timelines ----

function renderRecent() {
  $("recent").replaceChildren(...state.tasks.slice(0, 30).map((row) => {
    const item = el("li", { "data-task": row.taskId },
      el("div", { class: "row" },
        el("span", { class: "state " + row.state }, row.state), " ",
        clock(row.receivedAtMs) + " · ", el("span", { class: "title" }, bdi(row.title || row.taskId)),
        " · ", bdi(row.agent), " · from ", bdi(row.sender)),
      row.reason && row.state !== "answered" ? el("div", { class: "error" }, bdi(row.reason)) : null);
    item.querySelector(".row").onclick = () => showTimeline(item, row.id || row.taskId);
    return item;
  }));
}

async function showTimeline(item, id) {
  const old = item.querySelector(".timeline");
  if (old) { old.remove(); return; }
  const response = await fetch("/api/task?id=" + encodeURIComponent(id), { headers: auth() });
  if (!response.ok) return;
  const found = await response.json();
  const steps = (found[0] && found[0].timeline) || [];
  const start = steps.length ? steps[0].atMs : 0;
  const lines = steps.map((s) => el("div", {}, "+" + String(s.atMs - start).padStart(7) + " ms  ", bdi(s.what), s.detail ? ": " : "", s.detail ? bdi(s.detail) : null));
  item.append(el("pre", { class: "timeline" }, ...lines));
}

// ---- charts: tasks per minute, and dispatch → result time, per agent ----

function bars(values, cls, title) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 " + values.length * 10 + " 100");
  svg.setAttribute("preserveAspectRatio", "none");
  const max = Math.max(...values, 1e-9);
  values.forEach((v, i) => {
    const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const h = (v / max) * 100;
    r.setAttribute("x", i * 10 + 1);
    r.setAttribute("y", 100 - h);
    r.setAttribute("width", 8);
    r.setAttribute("height", h);
    if (cls) r.setAttribute("class", cls);
    svg.append(r);
  });
  svg.append(Object.assign(document.createElementNS("http://www.w3.org/2000/svg", "title"), { textContent: title }));
  return svg;
}

function renderCharts() {
  const now = Date.now() + state.nowOffset;
  const n = (HOURS * 60) / BUCKET_MIN;
  const from = now - HOURS * 3600 * 1000;
  $("charts").replaceChildren(...state.agents.map((a) => {
    const count = new Array(n).fill(0);
    const time = new Array(n).fill(0);
    for (const row of state.tasks) {
      if (row.agent !== a.agent || row.receivedAtMs < from) continue;
      const i = Math.min(n - 1, Math.floor((row.receivedAtMs - from) / (BUCKET_MIN * 60000)));
      count[i] += 1;
      if (row.state === "answered" || row.state === "rejected" || row.state === "cancelled") {
        time[i] += Math.max(0, row.updatedAtMs - row.receivedAtMs);
      }
    }
    const perMin = count.map((c) => c / BUCKET_MIN);
    const meanSecs = time.map((t, i) => (count[i] ? t / count[i] / 1000 : 0));
    const peak = Math.max(...perMin);
    const slowest = Math.max(...meanSecs);
    return el("article", { class: "card chart", "data-agent": a.agent },
      el("h3", {}, bdi(a.agent)),
      el("div", { class: "meta" }, "tasks per minute (peak " + peak.toFixed(1) + "), last " + HOURS + " h"),
      bars(perMin, "", "tasks per minute"),
      el("div", { class: "meta" }, "dispatch → result, mean per " + BUCKET_MIN + " min (longest " + slowest.toFixed(1) + " s)"),
      bars(meanSecs, "time", "seconds from dispatch to result"));
  }));
}

// ---- usage: tokens and cost today and per hour, per agent and per sender (UTC) ----

// Tokens and cost in a few words; "unknown" is never shown as $0.
function spent(u) {
  if (!u || !u.totalTokens) return "nothing reported";
  const cost = typeof u.costUsd === "number" ? "$" + u.costUsd.toFixed(4) + (u.costPartial ? "+" : "") : "cost unknown";
  return u.totalTokens.toLocaleString("en") + " tokens · " + cost;
}

function agentUsage(agent) {
  return state.usage && state.usage.agents ? state.usage.agents[agent] : null;
}

let usageTimer = null;
// A task finished with usage: the sums are read again (at most once a second).
function refreshUsage() {
  if (usageTimer) return;
  usageTimer = setTimeout(async () => {
    usageTimer = null;
    try {
      const response = await fetch("/api/usage", { headers: auth() });
      if (!response.ok) return;
      state.usage = await response.json();
    } catch (_) {
      return; // the feed's own reconnect says the bridge is away
    }
    renderUsage();
    renderAgents();
  }, 1000);
}

// Reports journaled while tasks still run, and the hours as they turn: read again each minute.
setInterval(refreshUsage, 60000);

function usageTable(kind, sums, hour) {
  const names = Object.keys(sums || {}).sort();
  if (!names.length) return el("p", { class: "quiet" }, "no " + kind + " spent anything today");
  const row = (name) => el("tr", { "data-key": name },
    el("td", {}, bdi(name)), el("td", { class: "day" }, spent(sums[name])), el("td", { class: "hour" }, spent((hour || {})[name])));
  return el("table", { class: "usage-" + kind },
    el("thead", {}, el("tr", {}, el("th", {}, kind), el("th", {}, "today"), el("th", {}, "this hour"))),
    el("tbody", {}, ...names.map(row)));
}

function renderUsage() {
  const u = state.usage;
  if (!u) { $("usage").replaceChildren(el("p", { class: "quiet" }, "no usage read")); return; }
  const hours = u.hours || [];
  const last = hours[hours.length - 1] || {};
  const tokens = hours.map((h) => (h.usage && h.usage.totalTokens) || 0);
  const note = (u.uncostedModels || []).length ? el("div", { class: "meta uncosted" }, "no cost known for: ", bdi(u.uncostedModels.join(", "))) : null;
  $("usage").replaceChildren(el("article", { class: "card usage" },
    el("div", { class: "total" }, "today (" + u.day + ", UTC): " + spent(u.today)),
    el("div", { class: "meta" }, "tokens per hour, last 24 h (peak " + Math.max(0, ...tokens).toLocaleString("en") + ")"),
    bars(tokens, "tokens", "tokens per hour"),
    note,
    usageTable("agent", u.agents, last.agents),
    usageTable("sender", u.senders, last.senders)));
}

connect();
