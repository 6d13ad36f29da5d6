// The tab's session with the hub, once for every page (the dashboard, its charts and stream
// administration, the stream page): the token the user gave, kept in sessionStorage (the tab's,
// gone with it; never a cookie: docs/security.md, "Browsers"), the headers that carry it, and
// the address of the hub's Tube endpoint. Every page of a tab shares the token, so a token
// given on the dashboard also serves the stream page it opens, and the other way round.
// A plain ES module, no build step.

const TOKEN_KEY = "tidewire.token";

// The tab's token, or null (anonymous).
export function token() { return sessionStorage.getItem(TOKEN_KEY); }

export function setToken(value) { sessionStorage.setItem(TOKEN_KEY, value); }

export function forgetToken() { sessionStorage.removeItem(TOKEN_KEY); }

// `headers` (a plain object) with `Authorization: Bearer <token>` added when the tab has one.
export function withToken(headers) {
  const t = token();
  return t === null ? headers : { ...headers, Authorization: `Bearer ${t}` };
}

// The options of an RsioOverTube (/static/tube.js) for the tab's principal.
export function tubeOptions() {
  const t = token();
  return t === null ? {} : { token: t };
}

// ws(s)://<this host>/tube: RS.io on Tube, on the origin the page came from.
export function tubeUrl() {
  const url = new URL("/tube", location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}
