// The live-tail page (web/tail.html): a file, not inline, for the hub's Content-Security-Policy
// (script-src 'self', no 'unsafe-inline').
import { tubeUrl } from "./session.js";
import { RsioOverTube, decodeEnvelope } from "./tube.js";
import { asText, time } from "./values.js";

const params = new URLSearchParams(location.search);
const stream = params.get("stream") || "";
const from = params.get("from") || "latest";
const WINDOW = Number(params.get("window") || 16); // demand asked for at a time
const KEEP = 500; // rows shown
const $ = (id) => document.getElementById(id);
$("stream").textContent = stream;
let paused = false, outstanding = 0, count = 0, sub = null;

function status(s, error = false) { $("status").textContent = s; $("status").className = error ? "error" : ""; }
function showDemand() { $("demand").textContent = String(outstanding); }

function topUp() { // ask for more only when not paused and half the window is used
  if (!sub || paused || outstanding > WINDOW / 2) return;
  const n = WINDOW - outstanding;
  outstanding += n;
  sub.request(n);
  showDemand();
}

function row(e) {
  const tr = document.createElement("tr");
  tr.className = "event";
  // (as the dashboard's tail and the stream page show them: values.js)
  for (const cell of [String(e.id), time(e.timestamp), asText(e.key), asText(e.value)]) {
    const td = document.createElement("td");
    td.textContent = cell;
    tr.appendChild(td);
  }
  const body = $("events");
  body.prepend(tr);
  while (body.children.length > KEEP) body.lastChild.remove();
}

$("pause").onclick = () => {
  paused = !paused;
  $("pause").textContent = paused ? "Resume" : "Pause";
  status(paused ? "paused" : "live");
  topUp();
};
window.tidewireTail = { pause: () => { if (!paused) $("pause").click(); },
                        resume: () => { if (paused) $("pause").click(); },
                        state: () => ({ paused, outstanding, count }) };

if (!stream) {
  status("no stream given (?stream=<name>)", true);
} else {
  const hub = new RsioOverTube(tubeUrl()); // (anonymous: the page takes no token)
  hub.ready.then(() => {
    status("live");
    const name = `${encodeURIComponent(stream)}?from=${encodeURIComponent(from)}`;
    outstanding = WINDOW;
    sub = hub.subscribe(name, WINDOW, (element) => {
      outstanding -= 1;
      count += 1;
      $("count").textContent = String(count);
      row(decodeEnvelope(element));
      showDemand();
      topUp();
    }, {
      onComplete: () => status("complete"),
      onError: (reason) => status(`error: ${reason}`, true),
    });
    showDemand();
  }, (err) => status(`cannot connect: ${err.message}`, true));
}
