// The dashboard's stream administration (web/dashboard.html, section "Manage streams"):
// create a stream with its retention, change a stream's retention, delete a stream after the
// user typed its name. Each is one fetch to the admin API (POST /api/streams, PATCH and
// DELETE /api/streams/<name>; docs/observability.md, "Admin API"), with the header
// X-Tidewire-Request: 1 and a JSON body (what the hub's cross-site rules ask of an admin
// write: docs/security.md, "Browsers") and the tab's token, if any, as a bearer token. The
// hub allows them only to a principal the ACL grants `admin` on the stream; a refusal is
// shown as the hub worded it. A plain ES module, no build step; text reaches the DOM as
// textContent only.

const TOKEN_KEY = "tidewire.token"; // the dashboard's (sessionStorage): the same principal
const REFRESH_MS = 5000; // the stream list of the selectors
const $ = (id) => document.getElementById(id);

const state = { streams: [], results: 0, last: null, busy: false };

function headers() {
  const h = { "X-Tidewire-Request": "1", "Content-Type": "application/json",
              Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token !== null) h.Authorization = `Bearer ${token}`;
  return h;
}

// "" -> undefined (not given), "none" -> null (no bound), digits -> a number; else an error
function bound(text, what) {
  const t = text.trim().toLowerCase();
  if (t === "") return undefined;
  if (t === "none" || t === "forever") return null;
  if (!/^\d+$/.test(t)) throw new Error(`${what}: a whole number, or "none" for no bound`);
  return Number(t);
}

function describe(r) {
  if (!r) return "—";
  const ms = r.ms === null ? "no time bound" : `${r.ms} ms`;
  const by = r.bytes === null ? "no size bound" : `${r.bytes} bytes`;
  return `${ms}, ${by} (${r.source})`;
}

function show(ok, message) {
  state.results += 1;
  state.last = { ok, message };
  const out = $("admin-result");
  out.textContent = message;
  out.className = ok ? "ok" : "error";
}

// One admin request; its JSON answer, or an Error worded as the hub answered
async function call(method, path, body) {
  const init = { method, headers: headers(), cache: "no-store" };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  let answer = null;
  try { answer = await response.json(); } catch { answer = null; }
  if (!response.ok) {
    const why = answer && answer.error ? answer.error : response.statusText;
    throw new Error(`${response.status}: ${why}`);
  }
  return answer;
}

async function act(work) {
  if (state.busy) return;
  state.busy = true;
  try {
    show(true, await work());
  } catch (err) {
    show(false, String(err.message || err));
  } finally {
    state.busy = false;
    loadStreams();
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

$("retention-form").addEventListener("submit", (event) => {
  event.preventDefault();
  act(async () => {
    const name = $("retention-stream").value;
    const body = retentionBody("retention-ms", "retention-bytes");
    if (Object.keys(body).length === 0) throw new Error("give a retention in ms or bytes (or none)");
    const answer = await call("PATCH", `/api/streams/${encodeURIComponent(name)}`, body);
    return `${answer.name}: retention now ${describe(answer.retention)}`;
  });
});

// Deleting asks the user to type the stream's name: the button is enabled only when it matches
function checkConfirm() {
  const name = $("delete-stream").value;
  $("delete-submit").disabled = name === "" || $("delete-confirm").value !== name;
}
$("delete-stream").addEventListener("change", checkConfirm);
$("delete-confirm").addEventListener("input", checkConfirm);
$("delete-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const name = $("delete-stream").value;
  if ($("delete-confirm").value !== name) return;
  act(async () => {
    await call("DELETE", `/api/streams/${encodeURIComponent(name)}`);
    $("delete-confirm").value = "";
    checkConfirm();
    return `deleted ${name}`;
  });
});

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

function showCurrent() {
  const s = state.streams.find((x) => x.name === $("retention-stream").value);
  $("retention-current").textContent = s ? describe(s.retention) : "—";
}
$("retention-stream").addEventListener("change", showCurrent);

async function loadStreams() {
  try {
    const h = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token !== null) h.Authorization = `Bearer ${token}`;
    const response = await fetch("/api/streams", { headers: h, cache: "no-store" });
    if (!response.ok) return; // (the dashboard says why, and asks for a token)
    state.streams = await response.json();
    const names = state.streams.map((s) => s.name);
    options($("retention-stream"), names);
    options($("delete-stream"), names);
    showCurrent();
    checkConfirm();
  } catch {
    // (the dashboard's own poll reports a hub that does not answer)
  }
}

window.tidewireAdmin = {
  state: () => ({ streams: state.streams.map((s) => s.name), results: state.results,
                  last: state.last, busy: state.busy }),
  reload: () => loadStreams(),
};

loadStreams();
setInterval(loadStreams, REFRESH_MS);
