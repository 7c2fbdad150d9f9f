// A live chart of one utterance: a tick per audio frame when it arrived, and the
// playback buffer level as a line, both against time since the first text.

const MIN_SPAN_MS = 3000;
const MIN_BUFFER_SCALE_MS = 500;
const LABEL_BAND = 18; // px at the top kept for the labels: the line never reaches them
const TICK_BAND = 16; // px at the bottom for the arrival ticks

export class Timeline {
  constructor(canvas) {
    this.canvas = canvas;
    this.context = canvas.getContext("2d");
    this.reset();
  }

  reset() {
    this.arrivals = []; // ms since the first text
    this.buffer = []; // [ms since the first text, buffered ms]
    this.underruns = []; // ms since the first text
  }

  addArrival(atMs) {
    this.arrivals.push(atMs);
  }

  addUnderrun(atMs) {
    this.underruns.push(atMs);
  }

  sampleBuffer(atMs, bufferedMs) {
    this.buffer.push([atMs, bufferedMs]);
  }

  draw() {
    // Draw at the size shown, so labels keep their size on a narrow screen.
    const shown = Math.round(this.canvas.clientWidth || 0);
    if (shown > 0 && shown !== this.canvas.width) this.canvas.width = shown;
    const { width, height } = this.canvas;
    const g = this.context;
    g.clearRect(0, 0, width, height);
    const lastBuffer = this.buffer.length ? this.buffer[this.buffer.length - 1][0] : 0;
    const lastArrival = this.arrivals.length ? this.arrivals[this.arrivals.length - 1] : 0;
    const spanMs = Math.max(MIN_SPAN_MS, lastArrival, lastBuffer) * 1.05;
    const x = (ms) => (ms / spanMs) * width;

    g.fillStyle = "#6c8cff";
    for (const at of this.arrivals) g.fillRect(x(at), height - 14, 1.5, 14);

    g.fillStyle = "#ff6b6b";
    for (const at of this.underruns) g.fillRect(x(at) - 1, 0, 3, height);

    const top = this.buffer.reduce((max, [, ms]) => Math.max(max, ms), MIN_BUFFER_SCALE_MS);
    const y = (ms) => height - TICK_BAND - (ms / top) * (height - TICK_BAND - LABEL_BAND);
    g.strokeStyle = "#3ecf8e";
    g.lineWidth = 1.5;
    g.beginPath();
    this.buffer.forEach(([at, ms], i) => (i ? g.lineTo(x(at), y(ms)) : g.moveTo(x(at), y(ms))));
    g.stroke();

    g.fillStyle = "#9aa0ad";
    g.font = "11px system-ui, sans-serif";
    g.textBaseline = "top";
    g.textAlign = "left";
    g.fillText(`buffer (max ${Math.round(top)} ms)`, 6, 3);
    // Right-aligned, so a long run ("214.4 s") keeps its unit inside the canvas.
    g.textAlign = "right";
    g.fillText(`${(spanMs / 1000).toFixed(1)} s`, width - 6, 3);
  }
}
