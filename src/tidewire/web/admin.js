// Stream administration in the browser, shared by the two pages that offer it:
// - the dashboard's "Manage streams" section (manageStreams): create a stream with its
//   retention, change a stream's retention, delete a stream;
// - the stream page's "Manage this stream" section (streamAdmin): the retention that applies
//   to the stream and where it comes from, a retention editor, and deleting the stream.
// Both pages use the same element ids for the same controls (retention-form, retention-ms,
// retention-bytes, retention-current, delete-form, delete-confirm, delete-submit,
// admin-result), so the wiring below is written once; a page names the stream a control acts
// on (the dashboard: a select; the stream page: its own).
//
// Each action is one fetch to the admin API (POST /api/streams, PATCH and DELETE
// /api/streams/<name>; docs/observability.md, "Stream administration"), with the header
// X-Tidewire-Request: 1 and a JSON body (what the hub's cross-site rules ask of an admin write:
// docs/security.md, "Browsers") and the tab's token, if any, as a bearer token. Deleting asks
// the user to type the stream's name: the button is enabled only when it matches, and the
// submit handler checks again (Enter in the field submits a form whatever the button's state).
// The hub allows the writes only to a principal the ACL grants `admin` on the stream; a
// refusal (401, 403, 404, 409, 501, 507...) is shown as "<status>: <the hub's words>".
// The retention shown comes from GET /api/streams (which needs `monitor`).
// A plain ES module, no build step; text reaches the DOM as textContent only.

import { withToken } from "/static/session.js";
import { bytes, duration } from "/static/values.js";

const REFRESH_MS = 5000; // the dashboard's stream list (the stream page reloads on its events)
const RESERVED_PREFIX = "_tidewire."; // the hub's own streams: listed only with ?internal=1
const $ = (id) => document.getElementById(id);

// What window.tidewireAdmin.state() shows (for tests): the streams of the last listing, the
// answers shown so far and the last one, whether a request is under way; on the stream page
// also its stream's retention as listed (undefined: not known; null: not listed or cluster
// mode), the listing's refusal, and whether the stream was deleted from this page.
const state = { streams: [], results: 0, last: null, busy: false, retention: undefined,
                listError: null, deleted: false, reload: () => {} };

// ---------------------------------------------------------------- the admin API

// A request the hub refused: its HTTP status and, in the message, the hub's own words.
export class AdminRefused extends Error {
  constructor(status, why) {
    super(`${status}: ${why}`);
    this.status = status;
    this.why = why;
  }
}

// One admin request; its JSON answer, or an AdminRefused worded as the hub answered: the
// routes answer {"error": ...}; the refusals made before them (bad credentials, cross-site
// rules, a body too large) are plain text.
export async function call(method, path, body) {
  const init = { method, cache: "no-store", headers: withToken({
    "X-Tidewire-Request": "1", "Content-Type": "application/json", Accept: "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  const raw = await response.text();
  let answer = null;
  try { answer = JSON.parse(raw); } catch { answer = null; }
  if (!response.ok) {
    const why = answer && typeof answer.error === "string" ? answer.error
      : raw.trim() || response.statusText;
    throw new AdminRefused(response.status, why);
  }
  return answer;
}

// GET /api/streams (the reserved streams too when `internal`): the list, or an AdminRefused.
async function listStreams(internal = false) {
  const response = await fetch(`/api/streams${internal ? "?internal=1" : ""}`,
                               { headers: withToken({ Accept: "application/json" }), cache: "no-store" });
  if (!response.ok) throw new AdminRefused(response.status, (await response.text()).trim() || response.statusText);
  return response.json();
}

// ---------------------------------------------------------------- retention as text

// "" -> undefined (not given), "none" -> null (no bound), digits -> a number; else an error
export function bound(text, what) {
  const t = text.trim().toLowerCase();
  if (t === "") return undefined;
  if (t === "none" || t === "forever") return null;
  if (!/^\d+$/.test(t)) throw new Error(`${what}: a whole number, or "none" for no bound`);
  return Number(t);
}

// A retention in one line, as the answers are shown: "60000 ms, no size bound (runtime)".
export function describe(r) {
  if (!r) return "—";
  const ms = r.ms === null ? "no time bound" : `${r.ms} ms`;
  const by = r.bytes === null ? "no size bound" : `${r.bytes} bytes`;
  return `${ms}, ${by} (${r.source})`;
}

// A retention for a reader: "60000 ms (1m 00s), 1048576 bytes (1.0 MiB)".
export function readable(r) {
  const ms = r.ms === null ? "no time bound"
    : r.ms >= 1000 ? `${r.ms} ms (${duration(r.ms / 1000)})` : `${r.ms} ms`;
  const by = r.bytes === null ? "no size bound"
    : r.bytes >= 1024 ? `${r.bytes} bytes (${bytes(r.bytes)})` : `${r.bytes} bytes`;
  return `${ms}, ${by}`;
}

// Where a retention comes from (GET /api/streams' retention.source), in words.
export function source(r, stream) {
  if (r.source === "runtime") {
    return "runtime: set through the admin API, kept over the configuration file's across restarts";
  }
  if (r.source === "config") return `config: the configuration file's [log.streams."${stream}"]`;
  if (r.source === "default") return "default: the configuration file's [log] retention_ms and retention_bytes";
  return r.source;
}

// ---------------------------------------------------------------- shown to the user

function show(ok, message) {
  state.results += 1;
  state.last = { ok, message };
  const out = $("admin-result");
  out.textContent = message;
  out.className = ok ? "ok" : "error";
}

// Run one action (at a time): its message, or its error's, is shown; then the page reloads
// what it shows. `refused(err)`, if given, hears of a refusal first (the stream page asks
// for a token on a 401).
async function act(work, refused = null) {
  if (state.busy) return;
  state.busy = true;
  try {
    show(true, await work());
  } catch (err) {
    if (refused !== null && err instanceof AdminRefused) refused(err);
    show(false, String(err.message || err));
  } finally {
    state.busy = false;
    state.reload();
  }
}

function retentionBody(msId, bytesId) {
  const body = {};
  const ms = bound($(msId).value, "retention (ms)");
  const by = bound($(bytesId).value, "retention (bytes)");
  if (ms !== undefined) body.retention_ms = ms;
  if (by !== undefined) body.retention_bytes = by;
  return body;
}

// ---------------------------------------------------------------- the controls of both pages

// The retention editor: PATCH the stream `nameOf()` names with what the fields hold.
function wireRetention(nameOf, onAnswer, refused) {
  $("retention-form").addEventListener("submit", (event) => {
    event.preventDefault();
    act(async () => {
      const name = nameOf();
      const body = retentionBody("retention-ms", "retention-bytes");
      if (Object.keys(body).length === 0) throw new Error("give a retention in ms or bytes (or none)");
      const answer = await call("PATCH", `/api/streams/${encodeURIComponent(name)}`, body);
      onAnswer(answer);
      return `${answer.name}: retention now ${describe(answer.retention)}`;
    }, refused);
  });
}

// The delete button, enabled only once the stream's name is typed exactly; `onDeleted(name)`
// after the hub deleted it. Returns the check, to run again when the name changes.
function wireDelete(nameOf, onDeleted, refused) {
  const check = () => {
    const name = nameOf();
    $("delete-submit").disabled = name === "" || $("delete-confirm").value !== name;
  };
  $("delete-confirm").addEventListener("input", check);
  $("delete-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const name = nameOf();
    if (name === "" || $("delete-confirm").value !== name) return; // (Enter with a wrong name)
    act(async () => {
      await call("DELETE", `/api/streams/${encodeURIComponent(name)}`);
      $("delete-confirm").value = "";
      check();
      onDeleted(name);
      return `deleted ${name}`;
    }, refused);
  });
  check();
  return check;
}

function exposeState() {
  window.tidewireAdmin = {
    state: () => ({ streams: state.streams.map((s) => s.name), results: state.results,
                    last: state.last, busy: state.busy, retention: state.retention,
                    listError: state.listError, deleted: state.deleted }),
    reload: () => state.reload(),
  };
}

// ---------------------------------------------------------------- the dashboard

function options(select, names) {
  const keep = select.value;
  select.replaceChildren(...names.map((n) => {
    const o = document.createElement("option");
    o.value = n;
    o.textContent = n;
    return o;
  }));
  if (names.includes(keep)) select.value = keep;
}

// The dashboard's "Manage streams" (web/dashboard.html): its three forms, and the stream list
// of its selectors, reloaded every REFRESH_MS and after each action.
export function manageStreams() {
  const showCurrent = () => {
    const s = state.streams.find((x) => x.name === $("retention-stream").value);
    $("retention-current").textContent = s ? describe(s.retention) : "—";
  };
  let checkDelete = () => {};
  state.reload = async () => {
    try {
      state.streams = await listStreams();
      const names = state.streams.map((s) => s.name);
      options($("retention-stream"), names);
      options($("delete-stream"), names);
      showCurrent();
      checkDelete();
    } catch {
      // (refused: the dashboard's own poll says why and asks for a token; or no answer)
    }
  };
  $("create-form").addEventListener("submit", (event) => {
    event.preventDefault();
    act(async () => {
      const name = $("create-name").value.trim();
      const answer = await call("POST", "/api/streams",
                                { name, ...retentionBody("create-ms", "create-bytes") });
      $("create-form").reset();
      return `created ${answer.name}: retention ${describe(answer.retention)}`;
    });
  });
  wireRetention(() => $("retention-stream").value, () => {}, null);
  checkDelete = wireDelete(() => $("delete-stream").value, () => {}, null);
  $("delete-stream").addEventListener("change", checkDelete);
  $("retention-stream").addEventListener("change", showCurrent);
  exposeState();
  state.reload();
  setInterval(() => state.reload(), REFRESH_MS);
}

// ---------------------------------------------------------------- the stream page

function showRetention(stream, r) {
  state.retention = r;
  if (r === undefined) return;
  $("retention-current").textContent = r === null ? "—" : readable(r);
  $("retention-source").textContent = r === null ? "" : source(r, stream);
}

// The stream page's "Manage this stream" (web/stream.html) for `stream`. `onDeleted()`: the
// hub deleted it (the page says it is gone); `askToken(message)`: an action was refused for
// want of credentials (401). Returns {reload}: the page calls it when its principal changed.
export function streamAdmin(stream, { onDeleted, askToken }) {
  const refused = (err) => {
    if (err.status === 401) askToken(`The hub asks for a token of a principal granted admin on this stream (${err.message}).`);
  };
  state.reload = async () => {
    if (state.deleted) return;
    try {
      state.streams = await listStreams(stream.startsWith(RESERVED_PREFIX));
      state.listError = null;
      const s = state.streams.find((x) => x.name === stream);
      showRetention(stream, s ? s.retention : null);
      if (!s) $("retention-current").textContent = "— (the hub does not list this stream)";
      else if (s.retention === null) $("retention-current").textContent = "not known (a storage without stream administration)";
    } catch (err) {
      // (GET /api/streams needs `monitor`: a principal with `admin` alone can still act)
      state.listError = String(err.message || err);
      if (state.retention !== undefined) return; // (what an answer said stays shown)
      $("retention-current").textContent = `not shown: the hub refused /api/streams (${state.listError})`;
      $("retention-source").textContent = "";
    }
  };
  wireRetention(() => stream, (answer) => {
    $("retention-form").reset();
    showRetention(stream, answer.retention); // (shown even when the listing is refused)
  }, refused);
  wireDelete(() => stream, () => {
    state.deleted = true;
    $("manage").hidden = true; // (nothing left to manage, nor a retention to show)
    $("retention-line").hidden = true;
    onDeleted();
  }, refused);
  exposeState();
  state.reload();
  return { reload: () => state.reload() };
}
