// The dashboard's charts (the "Charts" section of /): polls /api/history (docs/observability.md)
// and draws time series with uPlot (vendored: /static/vendor/uplot-1.6.32, MIT), one chart per
// panel: events in and out per second per stream, each stream's largest subscription lag, and
// the log's append and fsync latencies (p50, p99). The first poll takes the whole history (the
// last dashboard.history_seconds, 15 minutes by default), the next ones only what is newer
// (?since=<the last time>). A plain ES module, no build step; uPlot styles through the CSSOM
// and this module through classes, so no inline style is needed (CSP).
//
// Query (shared with dashboard.js): ?refresh=<ms> (how often to poll).

import { withToken } from "/static/session.js";
import { positive } from "/static/values.js";
import uPlot from "/static/vendor/uplot-1.6.32/uPlot.esm.js";

const REFRESH_MS = 2000;
const FETCH_TIMEOUT_MS = 10000;
const HEIGHT = 180;
// Colour-blind-friendly (Okabe-Ito, then Tol's muted), picked by a hash of the stream's name so
// that a stream keeps its colour from one chart, poll and page to the next.
const PALETTE = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#332288",
                 "#117733", "#882255", "#44aa99", "#999933", "#aa4499"];
const QUANTILES = [["p50", "#0072b2"], ["p99", "#d55e00"]];

const params = new URLSearchParams(location.search);
const refreshMs = positive(params.get("refresh"), REFRESH_MS);
const $ = (id) => document.getElementById(id);

export function colour(name) {
  let h = 0;
  for (const c of name) h = (h * 31 + c.codePointAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

// ---------------------------------------------------------------- the history, kept here

// Columns as /api/history gives them: time (ms), streams {name: {series: [...]}}, latencies.
const history = { time: [], streams: {}, append_seconds: { p50: [], p99: [] },
                  fsync_seconds: { p50: [], p99: [] }, keep: 900 };

// Add an answer of /api/history (all of it, or what came after `since`) and keep the last
// `history_seconds` points.
export function merge(h, answer) {
  const before = h.time.length;
  const added = answer.time.length;
  h.keep = answer.history_seconds || h.keep;
  h.time.push(...answer.time);
  const names = new Set([...Object.keys(h.streams), ...Object.keys(answer.streams)]);
  for (const name of names) {
    const old = h.streams[name];
    const got = answer.streams[name];
    const columns = old || {};
    for (const series of ["events_in_rate", "bytes_in_rate", "events_out_rate", "bytes_out_rate", "max_lag"]) {
      if (!columns[series]) columns[series] = new Array(before).fill(null);
      columns[series].push(...(got ? got[series] : new Array(added).fill(null)));
    }
    h.streams[name] = columns;
  }
  for (const which of ["append_seconds", "fsync_seconds"]) {
    for (const q of ["p50", "p99"]) h[which][q].push(...answer[which][q]);
  }
  const drop = Math.max(0, h.time.length - h.keep);
  if (drop) {
    h.time.splice(0, drop);
    for (const which of ["append_seconds", "fsync_seconds"]) for (const q of ["p50", "p99"]) h[which][q].splice(0, drop);
    for (const [name, columns] of Object.entries(h.streams)) {
      for (const values of Object.values(columns)) values.splice(0, drop);
      if (columns.events_in_rate.every((v) => v === null)) delete h.streams[name]; // (gone)
    }
  }
}

// ---------------------------------------------------------------- the panels

const PANELS = [
  { id: "chart-in", title: "Events in per second", per: "stream", series: "events_in_rate", unit: "ev/s" },
  { id: "chart-out", title: "Events out per second", per: "stream", series: "events_out_rate", unit: "ev/s" },
  { id: "chart-lag", title: "Subscription lag (the largest per stream, events)", per: "stream", series: "max_lag", unit: "events" },
  { id: "chart-append", title: "Append latency (call to durable commit)", per: "quantile", series: "append_seconds", unit: "ms" },
  { id: "chart-fsync", title: "fsync latency (one group commit)", per: "quantile", series: "fsync_seconds", unit: "ms" },
];

const charts = new Map(); // panel id -> {plot, key (the series' names, joined)}

function seriesOf(panel) { // [[label, colour, values]]
  if (panel.per === "quantile") {
    return QUANTILES.map(([q, c]) => [q, c, history[panel.series][q].map((v) => (v === null ? null : v * 1000))]);
  }
  return Object.keys(history.streams).sort().map((name) => [name, colour(name), history.streams[name][panel.series]]);
}

function width(el) { return Math.max(300, el.clientWidth || 600); }

function draw(panel) {
  const el = $(panel.id);
  const series = seriesOf(panel);
  const xs = history.time.map((ms) => ms / 1000); // (uPlot's time scale is in seconds)
  const data = [xs, ...series.map(([, , values]) => values)];
  const key = series.map(([label]) => label).join("\u0000");
  const known = charts.get(panel.id);
  if (known && known.key === key) { known.plot.setData(data); return; }
  if (known) known.plot.destroy(); // (another set of series: a new chart)
  const plot = new uPlot({
    title: panel.title,
    width: width(el),
    height: HEIGHT,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max ?? 1) * 1.1] } },
    axes: [{}, { size: 60, label: panel.unit }],
    series: [{}, ...series.map(([label, stroke]) => ({ label, stroke, width: 2, spanGaps: false,
                                                         points: { show: false } }))],
    legend: { live: true },
  }, data, el);
  charts.set(panel.id, { plot, key });
}

function drawAll() {
  $("charts-empty").hidden = history.time.length > 0;
  for (const panel of PANELS) draw(panel);
}

window.addEventListener("resize", () => {
  for (const panel of PANELS) {
    const known = charts.get(panel.id);
    if (known) known.plot.setSize({ width: width($(panel.id)), height: HEIGHT });
  }
});

// ---------------------------------------------------------------- polling /api/history

const poll = { polls: 0, error: null, timer: null, last: null };

function chartStatus(message, error = false) {
  $("charts-status").textContent = message;
  $("charts-status").className = error ? "error" : "";
}

async function refresh() {
  clearTimeout(poll.timer);
  const abort = new AbortController();
  const timeout = setTimeout(() => abort.abort(), Math.max(FETCH_TIMEOUT_MS, refreshMs));
  try {
    const headers = withToken({ Accept: "application/json" });
    const since = poll.last === null ? "" : `?since=${poll.last}`;
    const response = await fetch(`/api/history${since}`, { headers, cache: "no-store", signal: abort.signal });
    if (response.status === 401 || response.status === 403) { // (the dashboard asks for a token)
      poll.error = `${response.status}`;
      chartStatus(`the hub refuses /api/history (${response.status}): waiting for a token`, true);
      return;
    }
    if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
    const answer = await response.json();
    merge(history, answer);
    if (history.time.length) poll.last = history.time[history.time.length - 1];
    drawAll();
    poll.polls += 1;
    poll.error = null;
    chartStatus(`${history.time.length} s of history`);
  } catch (err) {
    poll.error = abort.signal.aborted ? "no answer in time" : String(err.message || err);
    chartStatus(`cannot get /api/history: ${poll.error}`, true);
  } finally {
    clearTimeout(timeout);
    poll.timer = setTimeout(refresh, refreshMs);
  }
}

window.tidewireCharts = {
  state: () => ({
    polls: poll.polls, error: poll.error, points: history.time.length,
    streams: Object.keys(history.streams).sort(), charts: charts.size, refreshMs,
  }),
  colour,
};

refresh();
