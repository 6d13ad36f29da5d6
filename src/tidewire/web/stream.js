// The stream page (/stream?name=<stream>): a message browser over RS.io on Tube on WebSocket
// (/static/tube.js), with the RS.io publisher grammar (docs/protocols/rsio.md): a page is one
// bounded subscription `<stream>?from=<id>&until=<latest>[&key=...]` asking for one page of
// demand, cancelled once the page is full. No read API of its own: the hub checks `read` on the
// stream as for any subscription. Starting at a time uses `from-time=<ms>` where the hub has a
// time index; the page asks once and hides the control when the hub refuses the argument.
// A plain ES module, no build step, no inline script or style; data reaches the DOM as
// textContent only.
//
// The page's "Manage this stream" section (the retention that applies, changing it, deleting
// the stream) is /static/admin.js's; once the stream is deleted from here the page says it is
// gone and stops reading. Values become text through /static/values.js, as on the dashboard.
//
// Query: ?name=<stream> (required), &from=<id>|newest, &time=<ms>, &key=<text>, &size=<n>,
// &view=text|json|hex (kept up to date, so a link shows the same page).

import { streamAdmin } from "/static/admin.js";
import { forgetToken, setToken, token, tubeOptions, tubeUrl } from "/static/session.js";
import { RsioOverTube, decodeEnvelope } from "/static/tube.js";
import { asHex, asJson, asText, bytes, time, utf8text } from "/static/values.js";

const PAGE_BYTES = 8 * 1024 * 1024; // a page holds at most this many key and value bytes
const SHOWN_BYTES = 16 * 1024; // of one value, shown in the table (copy and download: all)
const MAX_SCAN = 1_000_000; // ids a backward page with a key filter looks through at most
const CHUNK = 256; // demand asked at a time while scanning backwards
const SIZES = [10, 25, 50, 100, 500];

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const stream = params.get("name") || "";

const state = {
  hub: null, // the open RsioOverTube, made on first use (again after a close)
  info: null, // the stream's ?streams answer: {exists, first_id, latest_id, events, bytes}
  events: [], // the page: [{id, timestamp, key, value}] in id order
  cut: false, // the page stopped at PAGE_BYTES
  timeIndex: null, // null: not asked yet; true/false: the hub takes from-time= or not
  view: ["text", "json", "hex"].includes(params.get("view")) ? params.get("view") : "text",
  loads: 0, // pages shown (for tests)
  error: null,
  busy: false,
  deleted: false, // deleted from this page: nothing more to read
};

// ---------------------------------------------------------------- formatting

// The value as the current view shows it (and as "copy" copies it): [text, note or null].
function rendered(value, view, limit = Infinity) {
  const cut = value.length > limit;
  const part = cut ? value.subarray(0, limit) : value;
  const more = cut ? `… ${value.length - limit} more byte(s): download to see all` : null;
  if (view === "hex") return [asHex(part), more];
  if (view === "json") {
    const pretty = cut ? null : asJson(value);
    if (pretty !== null) return [pretty, null];
    return [asText(part), more || "not JSON: shown as text"];
  }
  return [asText(part), more];
}

// ---------------------------------------------------------------- the hub

function status(message, error = false) {
  $("status").textContent = message;
  $("status").className = error ? "error" : "";
  state.error = error ? message : null;
}

async function connect() {
  if (state.hub !== null && state.hub.closed === null) return state.hub;
  const hub = new RsioOverTube(tubeUrl(), tubeOptions());
  state.hub = hub;
  try {
    await hub.ready;
  } catch (err) {
    state.hub = null;
    throw new Refused(hub.goodbye || err.message);
  }
  return hub;
}

class Refused extends Error {}

function encodeName(name) { return encodeURIComponent(name); }

function keyParam() {
  const key = $("key").value;
  return key === "" ? "" : `&key=${encodeURIComponent(key)}`; // (UTF-8, percent-encoded)
}

// Subscribe to `publisher` and gather elements. keepLast=0: stop (and cancel) once `limit`
// elements came, asking for exactly that demand; keepLast=n: read to the subscription's end
// in chunks of demand, keeping only the last n. Either way at most PAGE_BYTES are held.
// Resolves {events, complete, cut}; rejects with Refused on onError.
function collect(hub, publisher, limit, keepLast = 0) {
  return new Promise((resolve, reject) => {
    const events = [];
    let held = 0, cut = false, outstanding = keepLast ? CHUNK : limit, sub = null;
    const done = (complete) => { resolve({ events, complete, cut }); };
    const onNext = (element) => {
      const e = decodeEnvelope(element);
      outstanding -= 1;
      events.push(e);
      held += e.value.length + (e.key ? e.key.length : 0);
      if (keepLast) {
        while (events.length > keepLast || (held > PAGE_BYTES && events.length > 1)) {
          if (events.length <= keepLast) cut = true; // (dropped for its bytes, not its place)
          const old = events.shift();
          held -= old.value.length + (old.key ? old.key.length : 0);
        }
        if (outstanding === 0) { outstanding = CHUNK; sub.request(CHUNK); }
        return;
      }
      if (events.length >= limit || held >= PAGE_BYTES) {
        cut = held >= PAGE_BYTES && events.length < limit;
        sub.cancel();
        done(false);
      }
    };
    sub = hub.subscribe(publisher, keepLast ? CHUNK : limit, onNext, {
      onComplete: () => done(true),
      onError: (reason) => reject(new Refused(reason)),
    });
  });
}

// The stream's figures (the hub's `?streams=<name>` publisher).
async function refreshInfo(hub) {
  const { events } = await collectRaw(hub, `?streams=${encodeName(stream)}`);
  if (events.length === 0) throw new Refused(await whyNot(hub)); // (not listed: not readable)
  const info = JSON.parse(new TextDecoder().decode(events[0]));
  state.info = info;
  $("first-id").textContent = info.first_id === null ? "—" : String(info.first_id);
  $("latest-id").textContent = String(info.latest_id);
  $("event-count").textContent = String(info.events);
  $("byte-count").textContent = bytes(info.bytes);
  return info;
}

function collectRaw(hub, publisher) {
  return new Promise((resolve, reject) => {
    const events = [];
    hub.subscribe(publisher, 1, (element) => events.push(element), {
      onComplete: () => resolve({ events }),
      onError: (reason) => reject(new Refused(reason)),
    });
  });
}

// The listing leaves out the streams the principal may not read, silently: a subscription
// (without demand, cancelled at once) gets the hub's reason.
function whyNot(hub) {
  return new Promise((resolve) => {
    const sub = hub.subscribe(`${encodeName(stream)}?until=0`, 0, () => {}, {
      onSubscribed: () => { sub.cancel(); resolve("the hub does not list this stream"); },
      onComplete: () => resolve("the hub does not list this stream"),
      onError: (reason) => resolve(reason),
    });
  });
}

// Whether the hub takes `from-time=` (issue 23's time index): a subscription with it and no
// demand is accepted (`subscribed`, then cancelled) or refused (`onError` naming it).
function askTimeIndex(hub) {
  return new Promise((resolve) => {
    const sub = hub.subscribe(`${encodeName(stream)}?from-time=0`, 0, () => {}, {
      onSubscribed: () => { sub.cancel(); resolve(true); },
      onComplete: () => resolve(true),
      onError: (reason) => resolve(!/from-time/.test(reason)),
    });
  });
}

function showTimeControl(supported) {
  state.timeIndex = supported;
  $("mode-time").hidden = !supported;
  if (!supported && $("mode").value === "time") $("mode").value = "id";
  modeChanged();
}

// ---------------------------------------------------------------- pages

// A page forwards from `from` (an id, or {time: ms}), up to the latest id known now.
async function pageForward(hub, from, size) {
  const latest = state.info.latest_id;
  const start = typeof from === "number" ? `from=${from}` : `from-time=${from.time}`;
  if (typeof from === "number" && from > latest) return { events: [], cut: false };
  return collect(hub, `${encodeName(stream)}?${start}&until=${latest}${keyParam()}`, size);
}

// A page backwards: the last `size` events (matching the key) at or before `end`. Without a
// key that is one window of `size` ids; with one, windows four times wider each time, until
// the page is full, the stream's start is reached or MAX_SCAN ids were looked through.
async function pageBackward(hub, end, size) {
  const first = state.info.first_id;
  if (first === null || end < first) return { events: [], cut: false };
  let hi = end, width = size, scanned = 0, out = [], cut = false;
  while (out.length < size && hi >= first && scanned < MAX_SCAN) {
    const lo = Math.max(first, hi - width + 1);
    const r = await collect(hub, `${encodeName(stream)}?from=${lo}&until=${hi}${keyParam()}`,
                            size, size - out.length);
    out = r.events.concat(out);
    cut = cut || r.cut;
    scanned += hi - lo + 1;
    hi = lo - 1;
    width *= 4;
  }
  return { events: out, cut };
}

// Show a page: where = {from: id} | {time: ms} | {before: id} | {newest: true} | {oldest: true}.
async function load(where) {
  if (state.busy || state.deleted) return;
  state.busy = true;
  status("reading");
  try {
    const hub = await connect();
    const info = await refreshInfo(hub);
    if (state.timeIndex === null) showTimeControl(await askTimeIndex(hub));
    if (where.time !== undefined && !state.timeIndex) {
      throw new Error("this hub cannot start at a time (it has no time index): start at an id");
    }
    const size = pageSize();
    let page;
    if (!info.exists || info.first_id === null) page = { events: [], cut: false };
    else if (where.time !== undefined) page = await pageForward(hub, { time: where.time }, size);
    else if (where.oldest) page = await pageForward(hub, info.first_id, size);
    else if (where.from !== undefined) page = await pageForward(hub, Math.max(where.from, info.first_id), size);
    else page = await pageBackward(hub, where.before ?? info.latest_id, size);
    if (state.deleted) return; // (deleted while this page was read: the page says so)
    state.events = page.events;
    state.cut = page.cut;
    state.loads += 1;
    $("auth").hidden = true;
    render();
    remember(where);
    status(info.exists ? `read ${new Date().toLocaleTimeString()}` : "no such stream (yet)");
  } catch (err) {
    failed(err);
  } finally {
    state.busy = false;
  }
}

function askToken(message) {
  $("auth-message").textContent = message;
  $("auth").hidden = false;
  $("token-forget").hidden = token() === null;
}

// The stream was deleted from this page (admin.js): say so, with the way back, and read no more.
function gone() {
  state.deleted = true;
  if (state.hub !== null && state.hub.closed === null) state.hub.close();
  state.hub = null;
  state.events = [];
  $("browser").hidden = true;
  $("stream-info").hidden = true;
  $("auth").hidden = true;
  $("gone-name").textContent = stream;
  $("gone").hidden = false;
  status("deleted");
}

function failed(err) {
  if (state.deleted) return; // (the connection closed by gone(), or "stream deleted")
  const reason = String(err.message || err);
  if (err instanceof Refused && /may not|token|authenticat/.test(reason)) {
    askToken(`The hub refused: ${reason}. A token of a principal that may read this stream?`);
  } else if (err instanceof Refused && /from-time/.test(reason)) {
    showTimeControl(false); // (refused after all: an older hub behind the same address)
  }
  status(`cannot read: ${reason}`, true);
}

function pageSize() {
  const n = Number($("page-size").value);
  return SIZES.includes(n) ? n : 25;
}

// The URL shows this page: from its first id (a page found backwards too, which forwards from
// there is the same page), or from its time; the newest page stays "the newest" (no from=).
function remember(where) {
  const url = new URL(location.href);
  for (const k of ["from", "time", "key", "size", "view"]) url.searchParams.delete(k);
  if (where.time !== undefined) url.searchParams.set("time", String(where.time));
  else if (!where.newest && state.events.length) url.searchParams.set("from", String(state.events[0].id));
  else if (where.from !== undefined) url.searchParams.set("from", String(where.from));
  if ($("key").value !== "") url.searchParams.set("key", $("key").value);
  url.searchParams.set("size", String(pageSize()));
  url.searchParams.set("view", state.view);
  history.replaceState(null, "", url);
}

// ---------------------------------------------------------------- rendering

function render() {
  const tbody = $("messages").tBodies[0];
  const rows = state.events.map((e) => row(e));
  tbody.replaceChildren(...rows);
  $("messages-empty").hidden = rows.length > 0;
  const ev = state.events;
  $("page-info").textContent = ev.length === 0 ? "no events"
    : `ids ${ev[0].id}–${ev[ev.length - 1].id} · ${ev.length} event(s)`
      + (state.cut ? ` · cut at ${bytes(PAGE_BYTES)}` : "");
  const info = state.info;
  $("previous").disabled = ev.length === 0 || info === null || ev[0].id <= info.first_id;
  $("next").disabled = ev.length === 0 || info === null || ev[ev.length - 1].id >= info.latest_id;
  $("download-page").disabled = ev.length === 0;
}

function row(e) {
  const tr = document.createElement("tr");
  tr.className = "event";
  tr.dataset.id = String(e.id);
  const cell = (cls, text) => {
    const td = document.createElement("td");
    td.className = cls;
    td.textContent = text;
    tr.appendChild(td);
    return td;
  };
  cell("id num", String(e.id));
  cell("time", time(e.timestamp));
  cell("key", e.key === null ? "" : asText(e.key));
  const td = cell("value", "");
  const [shown, note] = rendered(e.value, state.view, SHOWN_BYTES);
  const pre = document.createElement("pre");
  pre.textContent = shown;
  td.appendChild(pre);
  if (note !== null) {
    const span = document.createElement("span");
    span.className = "note";
    span.textContent = note;
    td.appendChild(span);
  }
  const actions = cell("actions", "");
  actions.append(button("copy", "copy", () => copy(e, actions)), " ",
                 button("download", "download", () => downloadValue(e)));
  return tr;
}

function button(cls, text, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = cls;
  b.textContent = text;
  b.addEventListener("click", onClick);
  return b;
}

// ---------------------------------------------------------------- copy and download

// The value as shown (whole), to the clipboard: navigator.clipboard needs a secure context
// (https, or http on localhost/127.0.0.1); elsewhere a selected, off-screen textarea and the
// older copy command.
async function copy(e, where) {
  const [text] = rendered(e.value, state.view);
  let ok = false;
  if (window.isSecureContext && navigator.clipboard) {
    try { await navigator.clipboard.writeText(text); ok = true; } catch { /* below */ }
  }
  if (!ok) {
    const area = $("copy-fallback");
    area.hidden = false;
    area.value = text;
    area.select();
    ok = document.execCommand("copy");
    area.hidden = true;
  }
  where.classList.toggle("copied", ok);
  where.title = ok ? "copied" : "the browser refused to copy";
}

function save(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000); // (after the download began)
}

function safeName(s) { return s.replace(/[^A-Za-z0-9._-]+/g, "_"); }

function downloadValue(e) { // the value's bytes, exactly
  save(new Blob([e.value], { type: "application/octet-stream" }), `${safeName(stream)}-${e.id}.bin`);
}

function base64(b) {
  let s = "";
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode(...b.subarray(i, i + 0x8000));
  return btoa(s);
}

// The page as JSON Lines: {"id", "timestamp", "key", "value"}, key and value as strings when
// they are UTF-8, else "key_base64" / "value_base64" (a missing key: "key": null).
export function jsonLines(events) {
  return events.map((e) => {
    const line = { id: e.id, timestamp: e.timestamp };
    const key = e.key === null ? null : utf8text(e.key);
    if (e.key === null || key !== null) line.key = key; else line.key_base64 = base64(e.key);
    const value = utf8text(e.value);
    if (value !== null) line.value = value; else line.value_base64 = base64(e.value);
    return JSON.stringify(line) + "\n";
  }).join("");
}

function downloadPage() {
  const ev = state.events;
  if (ev.length === 0) return;
  save(new Blob([jsonLines(ev)], { type: "application/x-ndjson" }),
       `${safeName(stream)}-${ev[0].id}-${ev[ev.length - 1].id}.jsonl`);
}

// ---------------------------------------------------------------- controls

function modeChanged() {
  const mode = $("mode").value;
  $("from-id-label").hidden = mode !== "id";
  $("from-time-label").hidden = mode !== "time";
}

// "2026-11-26T10:00:00Z", a date-time without a zone (taken as UTC), or milliseconds.
export function parseTime(text) {
  const t = text.trim();
  if (/^-?\d+$/.test(t)) return Number(t);
  const zoned = /(Z|[+-]\d\d:?\d\d)$/i.test(t) ? t : `${t}Z`;
  const ms = Date.parse(zoned);
  return Number.isNaN(ms) ? null : ms;
}

function show() {
  const mode = $("mode").value;
  if (mode === "id") {
    const id = Number($("from-id").value);
    if (!Number.isInteger(id) || id < 1) { status("an id is a whole number from 1", true); return; }
    load({ from: id });
  } else if (mode === "time") {
    const ms = parseTime($("from-time").value);
    if (ms === null) { status("a time is RFC 3339 (UTC unless it says) or milliseconds", true); return; }
    load({ time: ms });
  } else {
    load({ newest: true });
  }
}

$("browse").addEventListener("submit", (event) => { event.preventDefault(); show(); });
$("mode").addEventListener("change", modeChanged);
for (const radio of document.querySelectorAll('input[name="view"]')) {
  radio.checked = radio.value === state.view;
  radio.addEventListener("change", () => {
    state.view = radio.value;
    render(); // (the same events, shown another way)
    const url = new URL(location.href);
    url.searchParams.set("view", state.view);
    history.replaceState(null, "", url);
  });
}
$("first").addEventListener("click", () => load({ oldest: true }));
$("newest").addEventListener("click", () => load({ newest: true }));
$("next").addEventListener("click", () => {
  const ev = state.events;
  if (ev.length) load({ from: ev[ev.length - 1].id + 1 });
});
$("previous").addEventListener("click", () => {
  if (state.events.length) load({ before: state.events[0].id - 1 });
});
$("download-page").addEventListener("click", downloadPage);
$("auth").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = $("token").value.trim();
  if (!value) return;
  setToken(value);
  $("token").value = "";
  reconnectAndShow();
});
$("token-forget").addEventListener("click", () => {
  forgetToken();
  reconnectAndShow();
});

function reconnectAndShow() { // (another principal: a connection of its own)
  if (state.hub !== null && state.hub.closed === null) state.hub.close();
  state.hub = null;
  state.timeIndex = null;
  $("auth").hidden = true;
  if (admin !== null) admin.reload(); // (what this principal may see of the retention)
  show();
}

// ---------------------------------------------------------------- start

window.tidewireStream = {
  state: () => ({
    stream, loads: state.loads, busy: state.busy, error: state.error, view: state.view,
    timeIndex: state.timeIndex, info: state.info, cut: state.cut, deleted: state.deleted,
    ids: state.events.map((e) => e.id),
  }),
};

document.title = `tidewire: ${stream}`;
$("stream-name").textContent = stream || "(none)";
const admin = stream ? streamAdmin(stream, { onDeleted: gone, askToken }) : null;
if (!stream) {
  $("admin").hidden = true;
  status("no stream: open /stream?name=<stream>", true);
} else {
  if (params.get("key") !== null) $("key").value = params.get("key");
  const size = Number(params.get("size"));
  if (SIZES.includes(size)) $("page-size").value = String(size);
  const from = Number(params.get("from"));
  if (params.get("time") !== null) {
    $("mode").value = "time";
    $("from-time").value = params.get("time");
  } else if (Number.isInteger(from) && from >= 1) {
    $("mode").value = "id";
    $("from-id").value = String(from);
  }
  modeChanged();
  show();
}
