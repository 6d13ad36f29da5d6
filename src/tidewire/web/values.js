// Values shown as text, once for every page of the hub (the dashboard and its live tail, the
// stream page, the live-tail page): a byte count, an event's timestamp, an event's key or value
// as text, JSON or a hex dump; and the few numbers a page reads from its query. Pure functions
// of their arguments (no DOM, no fetch), so that the same bytes read the same on every page.
// A plain ES module, no build step.

const utf8 = new TextDecoder("utf-8", { fatal: true });
// Control characters other than tab, LF and CR: text holding them is shown escaped, as bytes.
const CONTROL = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/;

// A byte count in binary units: "512 B", "1.5 KiB", ... "2.0 TiB" (null/undefined: "0 B").
export function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n || 0), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return i === 0 ? `${Math.round(v)} B` : `${v.toFixed(1)} ${units[i]}`;
}

// A span of seconds, rounded down, in its two or three largest units: "42s", "3m 07s",
// "2h 05m 09s", "7d 00h 00m".
export function duration(seconds) {
  let s = Math.floor(seconds || 0);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  const pad = (x) => String(x).padStart(2, "0");
  if (d) return `${d}d ${pad(h)}h ${pad(m)}m`;
  if (h) return `${h}h ${pad(m)}m ${pad(s)}s`;
  return m ? `${m}m ${pad(s)}s` : `${s}s`;
}

// An event's timestamp (ms since the epoch) as RFC 3339 in UTC; any 64-bit value is allowed on
// the wire and not every one is a Date: those are shown as the number.
export function time(ms) {
  const d = new Date(ms);
  return Number.isNaN(d.getTime()) ? String(ms) : d.toISOString();
}

// The bytes as UTF-8 text, or null when they are not UTF-8.
export function utf8text(b) {
  try { return utf8.decode(b); } catch { return null; }
}

// Bytes as UTF-8 text; else (not UTF-8, or control characters other than tab and newlines)
// printable ASCII with every other byte as \xNN and a backslash as \\. null (no key): "".
export function asText(b) {
  if (b === null) return "";
  const decoded = utf8text(b);
  if (decoded !== null && !CONTROL.test(decoded)) return decoded;
  let out = "";
  for (const c of b) {
    if (c === 0x5c) out += "\\\\";
    else if (c >= 0x20 && c < 0x7f) out += String.fromCharCode(c);
    else out += `\\x${c.toString(16).padStart(2, "0")}`;
  }
  return out;
}

// JSON pretty-printed (two spaces) when the bytes are UTF-8 and parse as JSON; else null.
export function asJson(b) {
  const decoded = utf8text(b);
  if (decoded === null) return null;
  try { return JSON.stringify(JSON.parse(decoded), null, 2); } catch { return null; }
}

// `hexdump -C`: offset, 16 bytes in hex (two groups of 8), the printable ASCII.
export function asHex(b) {
  const lines = [];
  for (let at = 0; at < b.length; at += 16) {
    const row = b.subarray(at, at + 16);
    let hex = "";
    for (let i = 0; i < 16; i++) {
      hex += i < row.length ? row[i].toString(16).padStart(2, "0") + " " : "   ";
      if (i === 7) hex += " ";
    }
    let ascii = "";
    for (const c of row) ascii += c >= 0x20 && c < 0x7f ? String.fromCharCode(c) : ".";
    lines.push(`${at.toString(16).padStart(8, "0")}  ${hex} |${ascii}|`);
  }
  return lines.join("\n");
}

// A query parameter as a whole number above 0 (rounded down); `fallback` when it is absent,
// not a number or not above 0.
export function positive(text, fallback) {
  const n = Number(text);
  return text !== null && Number.isFinite(n) && n > 0 ? Math.floor(n) : fallback;
}
