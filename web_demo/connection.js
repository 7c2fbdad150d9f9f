// Connection care for the page: when to try again after a lost connection, and
// what closes and server events mean, in plain words.

import { CLOSE_CODES, SERVER_EVENTS } from "./protocol.js";

// Standard WebSocket close codes the protocol does not define itself (RFC 6455).
const GOING_AWAY = 1001;
const ABNORMAL = 1006; // no close frame: the peer vanished
const SERVICE_RESTART = 1012;

const CLOSE_WORDS = {
  [CLOSE_CODES.NORMAL]: "the server closed the connection",
  [GOING_AWAY]: "the server is going away",
  [ABNORMAL]: "the connection dropped",
  [CLOSE_CODES.POLICY]: "the server refused this client",
  [CLOSE_CODES.TOO_BIG]: "a message was too big",
  [CLOSE_CODES.SERVER_ERROR]: "the server hit an internal error",
  [SERVICE_RESTART]: "the server is restarting",
  [CLOSE_CODES.TRY_AGAIN]: "the server is busy",
};

/** A WebSocket close as a sentence: "the server is restarting (code 1012)". */
export function describeClose(code, reason = "") {
  const words = CLOSE_WORDS[code] ?? "the connection closed";
  return `${words}${reason ? `: ${reason}` : ""} (code ${code})`;
}

const quote = (text) => `“${text.trim()}”`;
const seconds = (ms) => `${(ms / 1000).toFixed(1)} s`;

/** A server event in plain words, for the log. */
export function describeEvent(event) {
  const ctx = event.context_id;
  switch (event.type) {
    case SERVER_EVENTS.CONTEXT_CREATED:
      return `${ctx}: the server started the utterance`;
    case SERVER_EVENTS.SEGMENT_STARTED:
      return `${ctx}: speaking ${quote(event.text)}`;
    case SERVER_EVENTS.SEGMENT_DONE:
      return `${ctx}: segment ${event.segment} generated`;
    case SERVER_EVENTS.TEXT_FLUSHED:
      return `${ctx}: text flushed (${event.flush_id})`;
    case SERVER_EVENTS.CONTEXT_DONE:
      return event.status === "completed"
        ? `${ctx}: done, ${seconds(event.audio_ms)} of audio`
        : `${ctx}: failed after ${seconds(event.audio_ms)} of audio`;
    case SERVER_EVENTS.CONTEXT_CANCELLED:
      return `${ctx}: cancelled after ${seconds(event.audio_ms_sent)} of audio`;
    case SERVER_EVENTS.ERROR: {
      const { error } = event;
      const retry = error.retryable ? " (try again)" : "";
      return `error: ${error.message} [${error.code}]${retry}`;
    }
    default:
      return event.type;
  }
}

/**
 * Reconnects with exponential backoff (with jitter, so many pages do not come
 * back in step), never sooner than the server asked for (`retry_after_ms`).
 */
export class Reconnector {
  constructor({ baseMs = 500, maxMs = 10_000, random = Math.random } = {}) {
    this.baseMs = baseMs;
    this.maxMs = maxMs;
    this.random = random;
    this.wanted = false; // the user asked to be connected
    this.attempt = 0;
    this.timer = null;
    this.dueAt = null;
  }

  /** The user pressed Connect. */
  start() {
    this._clear();
    this.wanted = true;
    this.attempt = 0;
  }

  /** The user pressed Disconnect, or a refusal that waiting cannot fix. */
  stop() {
    this._clear();
    this.wanted = false;
  }

  succeeded() {
    this._clear();
    this.attempt = 0;
  }

  get pending() {
    return this.timer !== null;
  }

  /** How long the next attempt waits: backoff, but at least the server's hint. */
  delayMs(retryAfterMs = null) {
    const backoff = Math.min(this.maxMs, this.baseMs * 2 ** this.attempt);
    const jittered = backoff * (0.8 + 0.4 * this.random());
    return Math.max(retryAfterMs ?? 0, jittered);
  }

  /** Run `attempt` after the delay (unless stopped first); returns the delay in ms. */
  schedule(retryAfterMs, attempt) {
    const delay = this.delayMs(retryAfterMs);
    this._clear();
    this.attempt += 1;
    this.dueAt = performance.now() + delay;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.dueAt = null;
      if (this.wanted) attempt();
    }, delay);
    return delay;
  }

  /** Seconds until the next attempt, or null when none is waiting. */
  waitS() {
    return this.dueAt === null ? null : Math.max(0, (this.dueAt - performance.now()) / 1000);
  }

  _clear() {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.dueAt = null;
  }
}
