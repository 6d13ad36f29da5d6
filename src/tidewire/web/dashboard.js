// The hub's dashboard (served at /): polls /api/stats (docs/observability.md) and renders it
// (on a gateway of a cluster also its "cluster": nodes, each group's leader and replicas),
// and tails one stream live over RS.io on Tube on WebSocket (/static/tube.js), with
// backpressure; its "Manage streams" section is /static/admin.js's. Values become text through
// /static/values.js, as on the other pages. A plain ES module, no build step. Data reaches the
// DOM as textContent only.
//
// Query: ?refresh=<ms> (how often to poll), ?tail=<stream> (tail it at once), ?window=<n>
// (the tail's demand window).

import { manageStreams } from "/static/admin.js";
import { forgetToken, setToken, token, tubeOptions, tubeUrl, withToken } from "/static/session.js";
import { RsioOverTube, decodeEnvelope } from "/static/tube.js";
import { asText, bytes, duration, positive, time } from "/static/values.js";

const REFRESH_MS = 2000; // how often /api/stats is polled
const FETCH_TIMEOUT_MS = 10000; // a poll that takes longer counts as failed
const TAIL_WINDOW = 16; // demand asked for at a time; topped up when half of it is used
const TAIL_KEEP = 200; // rows the tail shows
const TAIL_RETRY_MS = [1000, 2000, 5000, 10000]; // reconnecting a tail whose connection closed

const params = new URLSearchParams(location.search);
const refreshMs = positive(params.get("refresh"), REFRESH_MS);
const tailWindow = Math.max(2, positive(params.get("window"), TAIL_WINDOW));

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- formatting

function integer(n) { return n === null || n === undefined ? "—" : String(n); }

function rate(n) { return Number(n || 0).toFixed(1); }

// ---------------------------------------------------------------- tables

// Make tbody's rows those of `items`, in order, reusing the row of each key (so a row, and a
// button in it, survives a refresh). `columns`: [class, item => text] for each cell;
// `extra(tr)`, if given, is called once on a new row (after its cells) to add more.
function fill(table, items, keyName, keyOf, columns, extra = null) {
  const tbody = $(table).tBodies[0];
  const old = new Map();
  for (const tr of tbody.rows) old.set(tr.dataset[keyName], tr);
  const rows = items.map((item) => {
    const key = String(keyOf(item));
    let tr = old.get(key);
    old.delete(key);
    if (!tr) {
      tr = document.createElement("tr");
      tr.dataset[keyName] = key;
      for (const [cls] of columns) {
        const td = document.createElement("td");
        td.className = cls;
        tr.appendChild(td);
      }
      if (extra) extra(tr, item);
    }
    columns.forEach(([, value], i) => {
      const shown = value(item);
      if (tr.cells[i].textContent !== shown) tr.cells[i].textContent = shown;
    });
    return tr;
  });
  for (const tr of old.values()) tr.remove();
  rows.forEach((tr, i) => { if (tbody.rows[i] !== tr) tbody.insertBefore(tr, tbody.rows[i] || null); });
  $(`${table}-empty`).hidden = items.length > 0;
}

// {protocol: n} as "rsio 1 · tube 2": <span data-protocol="rsio"><b class="count">1</b>...
function counts(id, byProtocol) {
  const spans = Object.entries(byProtocol || {}).map(([protocol, n]) => {
    const span = document.createElement("span");
    span.dataset.protocol = protocol;
    const count = document.createElement("b");
    count.className = "count";
    count.textContent = String(n);
    span.append(`${protocol} `, count);
    return span;
  });
  $(id).replaceChildren(...spans.flatMap((span, i) => (i ? [" · ", span] : [span])));
}

// One follower as "n3 lag 7" (behind), "n2" (current) or "n1 offline": a span each, so the
// page can colour the ones not caught up.
function replicas(td, group) {
  const spans = group.replicas.map((r) => {
    const span = document.createElement("span");
    span.dataset.replica = r.name;
    span.className = r.offline ? "offline" : r.current ? "current" : "behind";
    span.textContent = r.offline ? `${r.name} offline` : r.current ? r.name : `${r.name} lag ${r.lag}`;
    return span;
  });
  td.replaceChildren(...spans.flatMap((span, i) => (i ? [" · ", span] : [span])));
}

// The cluster (GET /api/stats' "cluster": only on a gateway of one); hidden when absent.
function renderCluster(c) {
  $("cluster").hidden = !c;
  if (!c) return;
  $("cluster-name").textContent = c.name;
  $("cluster-connected").textContent = c.connected;
  $("cluster-servers").textContent = c.servers.join(", ");
  $("cluster-age").textContent = duration(c.age_seconds);
  fill("cluster-nodes", c.nodes, "node", (n) => n.name, [
    ["node", (n) => n.name],
    ["leads num", (n) => String(n.leads)],
    ["current num", (n) => String(n.current)],
    ["behind num", (n) => String(n.behind)],
    ["offline num", (n) => String(n.offline)],
  ]);
  fill("cluster-groups", c.groups, "group", (g) => g.name, [
    ["group", (g) => g.name],
    ["leader", (g) => g.leader ?? "none (electing)"],
    ["replicas", () => ""],
    ["messages num", (g) => integer(g.messages)],
    ["bytes num", (g) => bytes(g.bytes)],
    ["last-seq num", (g) => integer(g.last_seq)],
  ]);
  const byName = new Map(c.groups.map((g) => [g.name, g]));
  for (const tr of $("cluster-groups").tBodies[0].rows) {
    const g = byName.get(tr.dataset.group);
    tr.classList.toggle("leaderless", g.leader === null);
    replicas(tr.cells[2], g);
  }
}

function render(stats) {
  renderCluster(stats.cluster);
  const o = stats.overview;
  $("version").textContent = o.version;
  $("uptime").textContent = duration(o.uptime_seconds);
  $("stream-count").textContent = String(o.streams);
  $("rate-in").textContent = `${rate(o.events_in_rate)} ev/s (${bytes(o.bytes_in_rate)}/s)`;
  $("rate-out").textContent = `${rate(o.events_out_rate)} ev/s (${bytes(o.bytes_out_rate)}/s)`;
  $("overview").title = `data: ${o.data_dir}; in ${o.events_in} events, out ${o.events_out} events`;

  fill("streams", stats.streams, "stream", (s) => s.name, [
    ["name", (s) => s.name],
    ["events num", (s) => integer(s.events)],
    ["bytes num", (s) => bytes(s.bytes)],
    ["rate-in num", (s) => rate(s.events_in_rate)],
    ["rate-out num", (s) => rate(s.events_out_rate)],
    ["latest num", (s) => integer(s.latest_id)],
  ], (tr, s) => {
    const td = document.createElement("td");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "tail";
    button.textContent = "tail";
    button.addEventListener("click", () => { chooseTail(s.name); });
    const browse = document.createElement("a"); // the stream page: its events, page by page
    browse.className = "browse";
    browse.href = `/stream?name=${encodeURIComponent(s.name)}`;
    browse.textContent = "browse";
    td.className = "actions";
    td.append(button, browse);
    tr.appendChild(td);
  });
  for (const tr of $("streams").tBodies[0].rows) {
    tr.classList.toggle("tailing", tail !== null && tr.dataset.stream === tail.stream);
  }

  counts("connections-by-protocol", o.connections);
  counts("subscriptions-by-protocol", o.subscriptions);
  fill("connections", stats.connections, "connection", (c) => c.id, [
    ["id num", (c) => String(c.id)],
    ["protocol", (c) => c.protocol],
    ["peer", (c) => c.peer || "—"],
    ["principal", (c) => c.principal ?? "—"],
    ["bytes-in num", (c) => bytes(c.bytes_in)],
    ["bytes-out num", (c) => bytes(c.bytes_out)],
  ]);

  fill("subscriptions", stats.subscriptions, "subscription", (s) => s.id, [
    ["id num", (s) => String(s.id)],
    ["protocol", (s) => s.protocol],
    ["stream", (s) => s.stream],
    ["connection num", (s) => integer(s.connection)],
    ["demand num", (s) => (s.unbounded ? "unbounded" : String(s.demand))],
    ["lag num", (s) => String(s.lag)],
  ]);

  const tolliver = stats.tolliver || { instance: null, peers: [] };
  $("tolliver-instance").textContent = tolliver.instance || "—";
  fill("tolliver", tolliver.peers, "peer", (p) => p.uuid, [
    ["uuid", (p) => p.uuid],
    ["address", (p) => p.address || "—"],
    ["connected", (p) => (p.connected ? "yes" : "no")],
    ["channels", (p) => p.channels.join(", ")],
    ["unacked num", (p) => String(p.unacked)],
    ["resends num", (p) => String(p.resends)],
  ]);
}

// ---------------------------------------------------------------- polling /api/stats

const poll = { timer: null, busy: false, again: false, refreshes: 0, last: null, error: null,
               needsToken: false };

function status(message, error = false) {
  $("status").textContent = message;
  $("status").className = error ? "error" : "";
  document.body.classList.toggle("stale", error);
}

function askToken(message) {
  poll.needsToken = true;
  $("auth-message").textContent = message;
  $("auth").hidden = false;
  $("token-forget").hidden = token() === null;
}

async function refresh() {
  if (poll.busy) { poll.again = true; return; }
  clearTimeout(poll.timer);
  poll.busy = true;
  const abort = new AbortController();
  const timeout = setTimeout(() => abort.abort(), Math.max(FETCH_TIMEOUT_MS, refreshMs));
  try {
    const headers = withToken({ Accept: "application/json" });
    const response = await fetch("/api/stats", { headers, cache: "no-store", signal: abort.signal });
    if (response.status === 401 || response.status === 403) {
      const why = (await response.text()).trim();
      poll.error = `${response.status}: ${why}`;
      status(`the hub refuses /api/stats (${poll.error}): waiting for a token`, true);
      askToken(token() === null ? "The hub asks for a token (a principal granted monitor)."
        : `The hub refused that token (${response.status}: ${why}). Another one?`);
      return;
    }
    if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
    const stats = await response.json();
    render(stats);
    poll.refreshes += 1;
    poll.last = Date.now();
    poll.error = null;
    poll.needsToken = false;
    $("auth").hidden = true;
    status(`updated ${new Date(poll.last).toLocaleTimeString()}`);
  } catch (err) {
    poll.error = abort.signal.aborted ? "no answer in time" : String(err.message || err);
    status(`cannot get /api/stats: ${poll.error} (retrying every ${refreshMs / 1000} s)`, true);
  } finally {
    clearTimeout(timeout);
    poll.busy = false;
    if (poll.again) {
      poll.again = false;
      refresh();
    } else if (!poll.needsToken) { // (refused: the same credentials would be refused again)
      poll.timer = setTimeout(refresh, refreshMs);
    }
  }
}

$("auth").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = $("token").value.trim();
  if (!value) return;
  setToken(value);
  $("token").value = "";
  $("auth").hidden = true;
  status("trying the token");
  refresh();
  if (tail !== null) chooseTail(tail.stream); // again, as that principal
});

$("token-forget").addEventListener("click", () => {
  forgetToken();
  $("token-forget").hidden = true;
  refresh();
  if (tail !== null) chooseTail(tail.stream); // again, anonymous
});

// ---------------------------------------------------------------- the live tail

let tail = null; // {stream, hub, sub, outstanding, count, lastId, retries, retryTimer}
let paused = false;

function tailStatus(message, error = false) {
  $("tail-status").textContent = message;
  $("tail-status").className = error ? "error" : "";
}

function showDemand() { $("tail-demand").textContent = String(tail ? tail.outstanding : 0); }

function topUp() { // ask for more only when not paused and half the window is used
  if (!tail || !tail.sub || paused || tail.outstanding > tailWindow / 2) return;
  const n = tailWindow - tail.outstanding;
  tail.outstanding += n;
  tail.sub.request(n);
  showDemand();
}

function addEvent(e) {
  const tr = document.createElement("tr");
  tr.className = "event";
  tr.dataset.id = String(e.id);
  const cells = [["id num", String(e.id)], ["time", time(e.timestamp)],
                 ["key", asText(e.key)], ["value", asText(e.value)]];
  for (const [cls, shown] of cells) {
    const td = document.createElement("td");
    td.className = cls;
    td.textContent = shown;
    tr.appendChild(td);
  }
  const body = $("tail-events").tBodies[0];
  body.prepend(tr);
  while (body.rows.length > TAIL_KEEP) body.lastElementChild.remove();
}

function stopTail() {
  if (tail === null) return;
  const t = tail;
  tail = null;
  clearTimeout(t.retryTimer);
  if (t.hub === null) return;
  try {
    if (t.sub) t.sub.cancel();
    t.hub.close(); // (a connection per tail: the next may carry another token)
  } catch { // not open yet: just drop it
    t.hub.tube.close();
  }
}

// Tail `stream` from now on (what is published after this), instead of any other.
function chooseTail(stream) {
  stopTail();
  tail = { stream, hub: null, sub: null, outstanding: 0, count: 0, lastId: null, retries: 0,
           retryTimer: null };
  $("tail-stream").textContent = stream;
  $("tail-count").textContent = "0";
  $("tail-events").tBodies[0].replaceChildren();
  $("tail-pause").disabled = false;
  for (const tr of $("streams").tBodies[0].rows) tr.classList.toggle("tailing", tr.dataset.stream === stream);
  const url = new URL(location.href);
  url.searchParams.set("tail", stream);
  history.replaceState(null, "", url);
  connectTail(tail, "latest");
}

function connectTail(t, from) {
  const hub = new RsioOverTube(tubeUrl(), tubeOptions());
  t.hub = hub;
  t.sub = null;
  t.outstanding = 0;
  showDemand();
  tailStatus("connecting");
  const current = () => tail === t && t.hub === hub;
  hub.ready.then(() => {
    if (!current()) return;
    t.retries = 0;
    tailStatus(paused ? "paused" : "live");
    t.outstanding = tailWindow;
    const name = `${encodeURIComponent(t.stream)}?from=${encodeURIComponent(from)}`;
    t.sub = hub.subscribe(name, tailWindow, (element) => {
      if (!current()) return;
      const e = decodeEnvelope(element);
      t.outstanding -= 1;
      t.count += 1;
      t.lastId = e.id;
      $("tail-count").textContent = String(t.count);
      addEvent(e);
      showDemand();
      topUp();
    }, {
      onComplete: () => { if (current()) tailStatus("complete"); },
      onError: (reason) => {
        if (!current()) return;
        if (hub.closed !== null) { retryTail(t, reason); return; }
        t.sub = null; // the hub said no (or failed the subscription): no retry
        t.outstanding = 0;
        showDemand();
        tailStatus(`refused: ${reason}`, true);
      },
    });
    showDemand();
  }, (err) => {
    if (!current()) return;
    if (hub.token !== null && hub.goodbye !== null) { // the hub said no to the token
      tailStatus(`refused: ${hub.goodbye}`, true);
    } else {
      retryTail(t, err.message);
    }
  });
}

function retryTail(t, reason) { // the connection closed: again, from the next event
  const delay = TAIL_RETRY_MS[Math.min(t.retries, TAIL_RETRY_MS.length - 1)];
  t.retries += 1;
  t.sub = null;
  t.outstanding = 0;
  showDemand();
  tailStatus(`disconnected (${reason}); retrying in ${delay / 1000} s`, true);
  t.retryTimer = setTimeout(() => {
    if (tail === t) connectTail(t, t.lastId === null ? "latest" : String(t.lastId + 1));
  }, delay);
}

$("tail-pause").addEventListener("click", () => {
  paused = !paused;
  $("tail-pause").textContent = paused ? "Resume" : "Pause";
  if (tail && tail.sub) tailStatus(paused ? "paused" : "live");
  topUp();
});

// ---------------------------------------------------------------- start

window.tidewireDashboard = {
  state: () => ({
    refreshes: poll.refreshes, lastRefresh: poll.last, error: poll.error,
    needsToken: poll.needsToken, refreshMs,
    tail: tail === null ? null : {
      stream: tail.stream, live: tail.sub !== null, count: tail.count, lastId: tail.lastId,
      outstanding: tail.outstanding, paused,
    },
  }),
  tail: (stream) => chooseTail(stream),
  pause: () => { if (!paused) $("tail-pause").click(); },
  resume: () => { if (paused) $("tail-pause").click(); },
};

if (params.get("tail")) chooseTail(params.get("tail"));
refresh();
manageStreams(); // (the "Manage streams" section: /static/admin.js)
