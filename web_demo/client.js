// A small client of the realtime speech protocol (speech.v1) for browsers.
//
//   const client = new SpeechClient(realtimeUrl(location, { token }));
//   const { session, limits } = await client.connect();
//   await client.updateSession({ voice: "default", output: { format: "pcm16" } });
//   const ctx = client.context("turn-1");
//   ctx.append("Hello there. "); ctx.end();
//   client.addEventListener("audio", (e) => play(e.detail));
//
// Every server event is re-dispatched as a DOM event named after its `type`
// (detail = the parsed message); binary audio frames (and base64 `audio.delta`
// events) become one "audio" event: { contextId, stream, seq, ptsMs, payload }.

import { CLIENT_EVENTS, FRAME_HEADER, SERVER_EVENTS, SUBPROTOCOL } from "./protocol.js";

export class ProtocolError extends Error {
  constructor(error) {
    super(`${error.code}: ${error.message}`);
    this.name = "ProtocolError";
    this.error = error;
  }
}

const FIELD = Object.fromEntries(FRAME_HEADER.fields.map((f) => [f.name, f]));

function readUint(view, field) {
  const littleEndian = !FRAME_HEADER.big_endian;
  if (field.bytes === 1) return view.getUint8(field.offset);
  if (field.bytes === 2) return view.getUint16(field.offset, littleEndian);
  if (field.bytes === 4) return view.getUint32(field.offset, littleEndian);
  throw new Error(`unsupported header field width ${field.bytes}`);
}

/** Parse one binary server frame: { stream, seq, ptsMs, payload: Uint8Array }. */
export function parseAudioFrame(buffer) {
  if (buffer.byteLength < FRAME_HEADER.bytes) {
    throw new Error(`frame of ${buffer.byteLength} bytes is shorter than the header`);
  }
  const view = new DataView(buffer);
  const version = readUint(view, FIELD.version);
  const kind = readUint(view, FIELD.kind);
  if (version !== FRAME_HEADER.version) throw new Error(`unsupported frame version ${version}`);
  if (kind !== FRAME_HEADER.kind_audio) throw new Error(`unknown frame kind ${kind}`);
  return {
    stream: readUint(view, FIELD.stream),
    seq: readUint(view, FIELD.seq),
    ptsMs: readUint(view, FIELD.pts_ms),
    payload: new Uint8Array(buffer, FRAME_HEADER.bytes),
  };
}

function base64Bytes(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

/** The WebSocket URL of the gateway serving this page (API keys never go in URLs). */
export function realtimeUrl(location, { token = null, model = null } = {}) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = new URL(`${scheme}//${location.host}/v1/realtime`);
  if (token) url.searchParams.set("token", token);
  if (model) url.searchParams.set("model", model);
  return url.toString();
}

/** Trade an API key for a short-lived token a browser may put in the URL. */
export async function mintToken(apiKey, expiresInS = 600) {
  const response = await fetch("/v1/tokens", {
    method: "POST",
    headers: { Authorization: `Bearer ${apiKey}`, "Content-Type": "application/json" },
    body: JSON.stringify({ expires_in_s: expiresInS }),
  });
  const body = await response.json();
  if (!response.ok) throw new ProtocolError(body.error);
  return body.token;
}

/** The voices this server offers: [{ voice_id, description, builtin, ... }]. */
export async function listVoices(token = null) {
  const url = token ? `/v1/voices?token=${encodeURIComponent(token)}` : "/v1/voices";
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new ProtocolError(body.error);
  return body.data;
}

export class SpeechClient extends EventTarget {
  constructor(url) {
    super();
    this.url = url;
    this.ws = null;
    this.session = null;
    this.limits = null;
    this._eventCounter = 0;
    this._pending = new Map(); // event_id -> { resolve, reject, expect }
    this._streams = new Map(); // stream number -> context_id
  }

  /** Open the socket; resolves with { session, limits } once session.created arrives. */
  connect() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(this.url, [SUBPROTOCOL]);
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      let opened = false;
      ws.onmessage = (message) => {
        if (typeof message.data === "string") {
          const event = JSON.parse(message.data);
          if (!opened && event.type === SERVER_EVENTS.SESSION_CREATED) {
            opened = true;
            this.session = event.session;
            this.limits = event.limits;
            resolve({ session: event.session, limits: event.limits });
          } else if (!opened && event.type === SERVER_EVENTS.ERROR) {
            reject(new ProtocolError(event.error)); // a refused connection
          }
          this._onEvent(event);
        } else {
          this._onFrame(message.data);
        }
      };
      ws.onclose = (close) => {
        if (!opened) reject(new Error(`connection closed (${close.code} ${close.reason})`));
        for (const pending of this._pending.values()) {
          pending.reject(new Error(`connection closed (${close.code})`));
        }
        this._pending.clear();
        this._emit("close", { code: close.code, reason: close.reason });
      };
    });
  }

  get connected() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  close(code = 1000) {
    if (this.ws) this.ws.close(code);
  }

  /** Send one client event; returns its event_id. */
  send(type, fields = {}) {
    if (!this.connected) throw new Error("not connected");
    const eventId = `c${++this._eventCounter}`;
    this.ws.send(JSON.stringify({ type, event_id: eventId, ...fields }));
    return eventId;
  }

  /** Send an event and wait for the server event of type `expect` that answers it. */
  request(type, fields, expect) {
    const eventId = this.send(type, fields);
    return new Promise((resolve, reject) => {
      this._pending.set(eventId, { resolve, reject, expect });
    });
  }

  /** Change settings for contexts created afterwards; resolves with the effective session. */
  async updateSession(patch) {
    const reply = await this.request(
      CLIENT_EVENTS.SESSION_UPDATE,
      { session: patch },
      SERVER_EVENTS.SESSION_UPDATED,
    );
    this.session = reply.session;
    return reply.session;
  }

  ping() {
    return this.request(CLIENT_EVENTS.PING, {}, SERVER_EVENTS.PONG);
  }

  context(contextId) {
    return new SpeechContext(this, contextId);
  }

  _emit(name, detail) {
    this.dispatchEvent(new CustomEvent(name, { detail }));
  }

  _onEvent(event) {
    if (event.type === SERVER_EVENTS.CONTEXT_CREATED) {
      this._streams.set(event.stream, event.context_id);
    }
    const replyTo = event.reply_to ?? event.error?.reply_to;
    const pending = replyTo ? this._pending.get(replyTo) : undefined;
    if (pending && (event.type === pending.expect || event.type === SERVER_EVENTS.ERROR)) {
      this._pending.delete(replyTo);
      if (event.type === SERVER_EVENTS.ERROR) pending.reject(new ProtocolError(event.error));
      else pending.resolve(event);
    }
    if (event.type === SERVER_EVENTS.AUDIO_DELTA) {
      this._emit("audio", {
        contextId: event.context_id,
        stream: null,
        seq: event.seq,
        ptsMs: event.pts_ms,
        payload: base64Bytes(event.audio),
      });
      return;
    }
    this._emit(event.type, event);
    this._emit("event", event); // every JSON event, for logs
  }

  _onFrame(buffer) {
    let frame;
    try {
      frame = parseAudioFrame(buffer);
    } catch (error) {
      this._emit("frame-error", { error }); // later protocol versions may add frame kinds
      return;
    }
    this._emit("audio", { contextId: this._streams.get(frame.stream) ?? null, ...frame });
  }
}

/** One utterance stream: text in (token by token if you like), audio out. */
export class SpeechContext {
  constructor(client, contextId) {
    this.client = client;
    this.id = contextId;
  }

  append(text) {
    return this.client.send(CLIENT_EVENTS.TEXT_APPEND, { context_id: this.id, text });
  }

  flush(flushId = undefined) {
    // JSON.stringify leaves out an undefined flush_id: the server then names the flush.
    return this.client.send(CLIENT_EVENTS.TEXT_FLUSH, { context_id: this.id, flush_id: flushId });
  }

  end() {
    return this.client.send(CLIENT_EVENTS.CONTEXT_END, { context_id: this.id });
  }

  cancel() {
    return this.client.send(CLIENT_EVENTS.CONTEXT_CANCEL, { context_id: this.id });
  }
}
