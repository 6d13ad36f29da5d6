// tidewire's browser client: RS.io (seed 000) over Tube (seed 001) over WebSocket.
// A plain ES module, no build step: import { RsioOverTube } from "/static/tube.js".
// The bytes are those of docs/protocols/tube.md and docs/protocols/rsio.md.

// ---------------------------------------------------------------- varints

// Tube: Avro's zig-zag varint of a signed 32-bit integer (1-5 bytes).
export function pushZigzag(n) {
  let z = ((n << 1) ^ (n >> 31)) >>> 0;
  const out = [];
  while (z > 0x7f) { out.push((z & 0x7f) | 0x80); z >>>= 7; }
  out.push(z);
  return out;
}

export function pullZigzag(bytes, pos) {
  let z = 0, shift = 0;
  for (let i = 0; i < 5; i++) {
    if (pos + i >= bytes.length) throw new Error("a varint cut short");
    const b = bytes[pos + i];
    z += (b & 0x7f) * 2 ** shift;
    shift += 7;
    if (!(b & 0x80)) return [z % 2 === 0 ? z / 2 : -(z + 1) / 2, pos + i + 1];
  }
  throw new Error("a varint longer than 5 bytes");
}

// RS.io: protobuf's unsigned varint (as a Number: exact up to 2^53).
export function pushVarint(n, out) {
  let v = n;
  while (v > 0x7f) { out.push((v % 128) | 0x80); v = Math.floor(v / 128); }
  out.push(v);
}

class NeedData extends Error {}

function pullVarint(bytes, pos) {
  let v = 0, mul = 1;
  for (let i = 0; i < 10; i++) {
    if (pos + i >= bytes.length) throw new NeedData();
    const b = bytes[pos + i];
    v += (b & 0x7f) * mul;
    mul *= 128;
    if (!(b & 0x80)) return [v, pos + i + 1];
  }
  throw new Error("a varint longer than 10 bytes");
}

const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder("utf-8", { fatal: true });

// ---------------------------------------------------------------- Tube

export class TubeSocket {
  // onOpen(), onMessage(Uint8Array), onClose(reason): set by the user.
  constructor(url, { fragmentSize = 65536 } = {}) {
    this.fragmentSize = fragmentSize;
    this.peerFragmentSize = null;
    this.onOpen = () => {};
    this.onMessage = () => {};
    this.onClose = () => {};
    this.incoming = null; // {code, count, received, parts}
    this.afterEmpty = false; // the last WebSocket message was an empty Tube message
    this.inflating = Promise.resolve(); // keeps decompressed messages in order
    this.ws = new WebSocket(url);
    this.ws.binaryType = "arraybuffer";
    this.ws.onopen = () => this.ws.send(new Uint8Array(pushZigzag(fragmentSize)));
    this.ws.onmessage = (e) => {
      try { this.receive(new Uint8Array(e.data)); } catch (err) { this.close(1002, String(err.message)); }
    };
    // (after the messages that came before the close, some of which may still be inflating)
    this.ws.onclose = (e) => { this.inflating.then(() => this.onClose(e.reason || `closed (${e.code})`)); };
  }

  receive(data) {
    if (this.peerFragmentSize === null) { // the server's fragment size
      const [size] = pullZigzag(data, 0);
      this.peerFragmentSize = size;
      this.onOpen();
      return;
    }
    const afterEmpty = this.afterEmpty;
    this.afterEmpty = false;
    if (this.incoming) { this.fragment(data); return; }
    if (data.length === 0 && afterEmpty) return; // an older tidewire's fragment after an empty message
    const code = data[0] >> 3;
    let count = data[0] & 7, pos = 1;
    if (code >= 8) { // control: the byte alone
      if (code === 16) this.ws.send(new Uint8Array([17 << 3])); // ping -> pong at once
      return;
    }
    if (count === 0) [count, pos] = pullZigzag(data, 1);
    this.incoming = { code, count, received: 0, parts: [], size: 0 };
    // The header alone: with one fragment, an empty message (README: its first fragment, glued
    // to it, is empty); with several, its first fragment is the next message (the seed's reading)
    if (pos === data.length && count === 1) this.afterEmpty = true;
    if (pos < data.length || count === 1) this.fragment(data.subarray(pos));
  }

  fragment(data) {
    const m = this.incoming;
    m.parts.push(data.slice());
    m.size += data.length;
    m.received += 1;
    if (m.received < m.count) return;
    this.incoming = null;
    const whole = new Uint8Array(m.size);
    let at = 0;
    for (const p of m.parts) { whole.set(p, at); at += p.length; }
    // A handler that throws must not break the chain: later messages (and onClose) still come.
    const failed = (err) => { console.error("tube: a message handler failed:", err); };
    if (m.code === 0) {
      this.inflating = this.inflating.then(() => this.onMessage(whole)).catch(failed);
    } else if (m.code === 1) { // deflate, zlib format
      this.inflating = this.inflating.then(async () => {
        const stream = new Blob([whole]).stream().pipeThrough(new DecompressionStream("deflate"));
        this.onMessage(new Uint8Array(await new Response(stream).arrayBuffer()));
      }).catch(failed);
    } else {
      this.ws.send(new Uint8Array([(8 + m.code) << 3])); // not supported: say so, drop it
    }
  }

  send(payload) { // one Tube message, split at the peer's fragment size
    const size = this.peerFragmentSize || 0;
    if (!size || payload.length + 1 <= size) {
      const msg = new Uint8Array(payload.length + 1);
      msg[0] = 1; // code 0 (plain), 1 fragment
      msg.set(payload, 1);
      this.ws.send(msg); // (an empty message: the header byte alone, 01)
      return;
    }
    let count = 1, head = 1, first = 0;
    for (;;) {
      head = count <= 7 ? 1 : 1 + pushZigzag(count).length;
      first = size - head;
      const needed = 1 + Math.ceil((payload.length - first) / size);
      if (needed === count) break;
      count = needed;
    }
    const header = count <= 7 ? [count] : [0, ...pushZigzag(count)];
    const msg = new Uint8Array(head + first);
    msg.set(header, 0);
    msg.set(payload.subarray(0, first), head);
    this.ws.send(msg);
    for (let s = first; s < payload.length; s += size) this.ws.send(payload.slice(s, s + size));
  }

  close(code = 1000, reason = "") { this.ws.close(code, reason.slice(0, 100)); }
}

// ---------------------------------------------------------------- RS.io

function string(s, out) { const b = utf8.encode(s); pushVarint(b.length, out); out.push(...b); }

// An envelope element: id | zigzag timestamp | key (0: none, else 1 + length, bytes) | value.
export function decodeEnvelope(bytes) {
  let [id, pos] = pullVarint(bytes, 0);
  let ts;
  [ts, pos] = pullVarint(bytes, pos);
  ts = ts % 2 === 0 ? ts / 2 : -(ts + 1) / 2;
  let k;
  [k, pos] = pullVarint(bytes, pos);
  let key = null;
  if (k > 0) { key = bytes.slice(pos, pos + k - 1); pos += k - 1; }
  return { id, timestamp: ts, key, value: bytes.slice(pos) };
}

export class RsioOverTube {
  // const hub = new RsioOverTube("ws://host:7480/tube"); await hub.ready;
  // const sub = hub.subscribe("orders?from=latest", 20, (element) => ..., {onComplete, onError});
  // sub.request(n); sub.cancel();
  // {token: "name.secret"}: a browser cannot set headers on a WebSocket, so the token goes
  // in-band (RS.io extension 2): clientHello(0, [2]), authenticate(token) once the hub's hello
  // came; ready resolves on authenticated(principal) (hub.principal), rejects on a refusal.
  constructor(url, options = {}) {
    const { token = null, ...tubeOptions } = options;
    this.tube = new TubeSocket(url, tubeOptions);
    this.token = token;
    this.principal = null;
    this.goodbye = null;
    this.buffer = new Uint8Array(0);
    this.subs = new Map();
    this.nextId = 1;
    this.closed = null;
    this.ready = new Promise((resolve, reject) => {
      this.authenticated = resolve;
      this.tube.onOpen = () => {
        if (token === null) { this.send([0, 0, 0]); resolve(this); } // clientHello(0, [])
        else this.send([0, 0, 1, 2]); // clientHello(0, [2]): ready once authenticated
      };
      this.tube.onClose = (closeReason) => {
        const reason = this.goodbye || closeReason; // the hub's goodbye says why, if it came
        this.closed = reason;
        reject(new Error(reason));
        for (const s of this.subs.values()) s.onError(`connection closed: ${reason}`);
        this.subs.clear();
      };
    });
    this.tube.onMessage = (data) => this.receive(data);
  }

  send(bytes) { this.tube.send(new Uint8Array(bytes)); }

  // onSubscribed(elementSize): the hub accepted the publisher name (RS.io `subscribed`).
  subscribe(publisher, initialDemand, onNext,
            { onComplete = () => {}, onError = () => {}, onSubscribed = () => {} } = {}) {
    const id = this.nextId++;
    const sub = {
      id, onNext, onComplete, onError, onSubscribed, elementSize: 0, received: 0,
      request: (n) => { const out = [4]; pushVarint(id, out); pushVarint(n, out); this.send(out); },
      cancel: () => { this.subs.delete(id); const out = [5]; pushVarint(id, out); this.send(out); },
    };
    this.subs.set(id, sub);
    const out = [3];
    string(publisher, out);
    pushVarint(id, out);
    pushVarint(initialDemand, out);
    this.send(out);
    return sub;
  }

  receive(data) {
    const joined = new Uint8Array(this.buffer.length + data.length);
    joined.set(this.buffer, 0);
    joined.set(data, this.buffer.length);
    let pos = 0;
    for (;;) {
      try {
        pos = this.frame(joined, pos);
      } catch (e) {
        if (e instanceof NeedData) break;
        this.tube.close(1002, e.message);
        return;
      }
      if (pos >= joined.length) break;
    }
    this.buffer = joined.slice(pos);
  }

  frame(b, start) { // one RS.io frame at start; the position after it (NeedData: wait)
    let [type, pos] = pullVarint(b, start);
    const str = () => {
      let n; [n, pos] = pullVarint(b, pos);
      if (pos + n > b.length) throw new NeedData();
      const s = fromUtf8.decode(b.subarray(pos, pos + n)); pos += n; return s;
    };
    const num = () => { let v; [v, pos] = pullVarint(b, pos); return v; };
    let sub;
    switch (type) {
      case 1: { // serverHello
        num(); const n = num(); const extensions = [];
        for (let i = 0; i < n; i++) extensions.push(num());
        if (this.token !== null) {
          if (!extensions.includes(2)) throw new Error("the hub does not offer authentication (RS.io extension 2)");
          const out = [0x43]; string(this.token, out); this.send(out); // authenticate(token)
        }
        return pos;
      }
      case 0x44: { this.principal = str(); this.authenticated(this); return pos; } // authenticated
      case 2: { const reason = str(); this.goodbye = reason; this.tube.close(1000, reason); return pos; } // goodbye
      case 6: { const id = num(); const size = num(); sub = this.subs.get(id); if (sub) { sub.elementSize = size; sub.onSubscribed(size); } return pos; }
      case 7: {
        const id = num(); sub = this.subs.get(id);
        let n = sub && sub.elementSize ? sub.elementSize : num();
        if (pos + n > b.length) throw new NeedData();
        const element = b.slice(pos, pos + n); pos += n;
        if (sub) { sub.received += 1; sub.onNext(element); }
        return pos;
      }
      case 8: {
        const id = num(); const count = num(); sub = this.subs.get(id);
        const size = sub ? sub.elementSize : 0;
        if (pos + count * size > b.length) throw new NeedData();
        for (let i = 0; i < count && sub; i++) { sub.received += 1; sub.onNext(b.slice(pos + i * size, pos + (i + 1) * size)); }
        return pos + count * size;
      }
      case 9: { const id = num(); sub = this.subs.get(id); this.subs.delete(id); if (sub) sub.onComplete(); return pos; }
      case 10: { const id = num(); const reason = str(); sub = this.subs.get(id); this.subs.delete(id); if (sub) sub.onError(reason); return pos; }
      default: throw new Error(`RS.io message type ${type} is not expected by this client`);
    }
  }

  close() { this.send([2, 0]); this.tube.close(1000, "client closing"); } // goodbye("")
}
