// Gapless playback of streamed audio: decoded chunks are scheduled back to back
// on the AudioContext clock. A small jitter buffer delays the start of each
// stream so that uneven arrivals do not become gaps; a chunk that arrives after
// its slot has already passed is an underrun (audible gap) and re-primes it.
// Underruns are found where audio is scheduled, which for Opus is when the
// decoder returns it, not when the packet arrived.
//
// All of a player's sources go through its own gain node, so stop() silences
// everything already scheduled at once (the node is cut from the graph) even
// while the server is still sending.
//
// Decoding: PCM and mu-law in JavaScript; Opus through WebCodecs' AudioDecoder
// (one Opus packet per frame, as the protocol sends them).

/** s16 little-endian bytes -> float samples. */
export function decodePcm16(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(bytes.byteLength >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
  return out;
}

/** f32 little-endian bytes -> float samples. */
export function decodePcmF32(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(bytes.byteLength >> 2);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

/** G.711 mu-law bytes -> float samples. */
export function decodeMulaw(bytes) {
  const out = new Float32Array(bytes.length);
  for (let i = 0; i < bytes.length; i++) {
    const u = ~bytes[i] & 0xff;
    const magnitude = ((((u & 0x0f) << 3) + 0x84) << ((u & 0x70) >> 4)) - 0x84;
    out[i] = (u & 0x80 ? -magnitude : magnitude) / 32768;
  }
  return out;
}

const PCM_DECODERS = { pcm16: decodePcm16, pcm_f32: decodePcmF32, mulaw: decodeMulaw };

// One AudioContext for the page: browsers allow a context to start only inside a
// user gesture, so it is made once (on the first click) and outlives players.
// Every player feeds one analyser in front of the speakers: the page's level
// meter (and anyone checking that a barge-in really went silent) reads it.
let sharedAudio = null;
let sharedOutput = null;

/** The page's AudioContext, started; call it first thing in a click handler. */
export async function unlockAudio() {
  if (sharedAudio === null) {
    sharedAudio = new AudioContext({ latencyHint: "interactive" });
    sharedOutput = sharedAudio.createAnalyser();
    sharedOutput.fftSize = 256; // ~5 ms at 48 kHz: a level that follows a stop at once
    sharedOutput.connect(sharedAudio.destination);
  }
  if (sharedAudio.state === "suspended") await sharedAudio.resume();
  return sharedAudio;
}

/** The analyser every player's audio passes through (null before unlockAudio). */
export function outputAnalyser() {
  return sharedOutput;
}

/** Peak absolute sample the speakers get right now (0 = silence). */
export function outputPeak() {
  if (sharedOutput === null) return 0;
  const samples = new Float32Array(sharedOutput.fftSize);
  sharedOutput.getFloatTimeDomainData(samples);
  let peak = 0;
  for (const s of samples) peak = Math.max(peak, Math.abs(s));
  return peak;
}

/** Whether this browser can decode the server's Opus packets (WebCodecs). */
export async function opusSupported(sampleRate = 48000) {
  if (typeof AudioDecoder === "undefined") return false;
  try {
    const { supported } = await AudioDecoder.isConfigSupported({
      codec: "opus",
      sampleRate,
      numberOfChannels: 1,
    });
    return Boolean(supported);
  } catch {
    return false;
  }
}

/** Opus packets in, float samples out (asynchronously, in order) through `onSamples`. */
class OpusStreamDecoder {
  constructor(sampleRate, onSamples, onError) {
    this.decoder = new AudioDecoder({
      output: (data) => {
        this.decoded += 1;
        const samples = new Float32Array(data.numberOfFrames);
        data.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
        onSamples(samples, data.sampleRate);
        data.close();
      },
      error: onError,
    });
    this.decoded = 0; // packets that came out as audio
    this.config = { codec: "opus", sampleRate, numberOfChannels: 1 };
    this.decoder.configure(this.config);
  }

  /** Resolves once every packet given so far has come out. */
  flush() {
    return this.decoder.state === "configured" ? this.decoder.flush() : Promise.resolve();
  }

  /** Drop packets still being decoded (their output never arrives). */
  reset() {
    if (this.decoder.state === "closed") return;
    this.decoder.reset();
    this.decoder.configure(this.config);
  }

  decode(payload, ptsMs) {
    // Every Opus packet decodes on its own: each chunk is a key chunk.
    this.decoder.decode(
      new EncodedAudioChunk({ type: "key", timestamp: ptsMs * 1000, data: payload }),
    );
  }

  close() {
    if (this.decoder.state !== "closed") this.decoder.close();
  }
}

export class StreamPlayer {
  /**
   * @param {object} options
   * @param {string} options.format   one of the protocol's AUDIO_FORMATS
   * @param {number} options.sampleRate  the session's output sample rate
   * @param {number} options.jitterMs  how much audio to hold before a stream starts
   */
  constructor({ format, sampleRate, jitterMs = 60 }) {
    this.format = format;
    this.sampleRate = sampleRate;
    this.jitterS = jitterMs / 1000;
    this.audio = null;
    this.opus = null;
    this.sources = new Set();
    this.nextTime = 0; // AudioContext time where the next chunk starts
    this.playing = false; // a stream is being scheduled
    this.underruns = 0;
    this.scheduledS = 0; // seconds of audio scheduled since resetCounters()
    this.gain = null; // this player's path to the speakers; replaced on every stop()
    this.onFirstSound = null; // (contextTime) => void, once per stream
    this.onUnderrun = null; // () => void, for every underrun
    this.onError = null;
  }

  /** Opus packets decoded into audio so far (0 for the PCM formats). */
  get decodedFrames() {
    return this.opus ? this.opus.decoded : 0;
  }

  /** Create the AudioContext; call it from a user gesture (browser autoplay rules). */
  async start() {
    this.audio = await unlockAudio();
    if (this.format === "opus" && !this.opus) {
      this.opus = new OpusStreamDecoder(
        this.sampleRate,
        (samples, rate) => this._schedule(samples, rate),
        (error) => this.onError?.(error),
      );
    }
  }

  /** One frame's payload (Uint8Array) in the player's format. */
  push(payload, ptsMs) {
    if (this.format === "opus") {
      this.opus.decode(payload, ptsMs);
      return;
    }
    const decode = PCM_DECODERS[this.format];
    if (!decode) throw new Error(`cannot play format ${this.format}`);
    this._schedule(decode(payload), this.sampleRate);
  }

  /** Seconds of audio scheduled but not yet heard. */
  bufferedS() {
    if (!this.audio) return 0;
    return Math.max(0, this.nextTime - this.audio.currentTime);
  }

  /** The current stream has no more audio: the next chunk starts a new stream. */
  async endOfStream() {
    try {
      if (this.opus) await this.opus.flush(); // its last packets are still being decoded
    } catch (error) {
      if (error.name !== "AbortError") throw error; // AbortError: a barge-in dropped them
    }
    this.playing = false;
  }

  /** Stop at once and drop everything scheduled (barge-in, disconnect). */
  stop() {
    if (this.gain) {
      // Cutting the node silences the next render quantum (~3 ms), whatever
      // the sources' own stop() does; a fresh node serves the next stream.
      this.gain.gain.value = 0;
      this.gain.disconnect();
      this.gain = null;
    }
    for (const source of this.sources) {
      try {
        source.stop();
      } catch {
        // a source that already ended cannot be stopped again; nothing to drop
      }
    }
    this.sources.clear();
    this.opus?.reset();
    this.nextTime = 0;
    this.playing = false;
  }

  /** Zero the counters of a new utterance (audio already scheduled keeps playing). */
  resetCounters() {
    this.underruns = 0;
    this.scheduledS = 0;
    if (this.opus) this.opus.decoded = 0;
  }

  close() {
    this.stop();
    this.opus?.close();
    this.opus = null;
    this.audio = null; // the page's AudioContext stays for the next player
  }

  _output() {
    if (this.gain === null) {
      this.gain = this.audio.createGain();
      this.gain.connect(sharedOutput ?? this.audio.destination);
    }
    return this.gain;
  }

  _schedule(samples, rate) {
    if (!this.audio || samples.length === 0) return;
    const now = this.audio.currentTime;
    if (!this.playing) {
      // A new stream: start after the jitter buffer (or right after earlier audio).
      this.nextTime = Math.max(this.nextTime, now + this.jitterS);
      this.playing = true;
      const startsAt = this.nextTime;
      if (this.onFirstSound) this.onFirstSound(startsAt);
    } else if (this.nextTime < now) {
      this.underruns += 1; // the chunk came after its slot: the listener heard a gap
      this.nextTime = now + this.jitterS;
      this.onUnderrun?.();
    }
    const buffer = this.audio.createBuffer(1, samples.length, rate);
    buffer.copyToChannel(samples, 0);
    const source = this.audio.createBufferSource();
    source.buffer = buffer;
    source.connect(this._output());
    source.onended = () => this.sources.delete(source);
    source.start(this.nextTime);
    this.sources.add(source);
    this.nextTime += buffer.duration;
    this.scheduledS += buffer.duration;
  }
}
