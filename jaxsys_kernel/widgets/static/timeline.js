// @ts-check
// Front end of TimelineView: every process's executables and collectives on one time axis.
//
// Plain ES module loaded by anywidget. Everything drawn comes from the `info` trait (a
// "timeline" summary), so a saved notebook redraws without a kernel. Wheel zooms around the
// pointer, drag pans, hovering a span names it with its duration.

const COLOURS = { executable: "#4e8fd6", collective: "#f08a24", line: "#b0b0b0" };
const ROW = 34;
const LEFT = 60;
const NS = "http://www.w3.org/2000/svg";

/** @param {string} tag @param {Record<string, string|number>} attrs */
function el(tag, attrs) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

/** The process the others waited for: the one that started each collective last (as
 * widgets/timeline.py decides; the kernel sends its answer as info.late when it has one).
 * @param {any} info */
function slowest(info) {
  const procs = info.processes || [];
  if (procs.length < 2) return null;
  if (typeof info.late === "number") return info.late;
  return procs.reduce((a, b) => (b.executable_us > a.executable_us ? b : a)).rank;
}

/** @param {{ model: any, el: HTMLElement }} ctx */
function render({ model, el: root }) {
  const width = 900;
  let view = { from: 0, to: 1 };
  const tip = document.createElement("div");
  tip.style.cssText = "font: 12px sans-serif; min-height: 1.4em; color: #333";
  const svg = el("svg", { width, "font-family": "sans-serif", "font-size": 11 });
  svg.style.cursor = "grab";

  function draw() {
    const info = model.get("info") || {};
    const procs = info.processes || [];
    const end = Math.max(info.end_us || 0, 1);
    const span = (view.to - view.from) * end;
    const scale = (width - LEFT - 10) / span;
    const x0 = view.from * end;
    const late = slowest(info);
    svg.replaceChildren();
    svg.setAttribute("height", String(ROW * procs.length + 24));
    procs.forEach((/** @type {any} */ p, /** @type {number} */ i) => {
      const y = 8 + i * ROW;
      const label = el("text", { x: 2, y: y + 18, "font-weight": p.rank === late ? "bold" : "normal" });
      label.textContent = `p${p.rank}${p.rank === late ? " (slowest)" : ""}`;
      svg.appendChild(label);
      for (const s of p.spans) {
        const x = LEFT + (s.start - x0) * scale;
        const w = Math.max(s.dur * scale, 0.5);
        if (x + w < LEFT || x > width) continue;
        const line = s.kind === "line";
        const rect = el("rect", {
          x: Math.max(x, LEFT), y: line ? y : y + 8, width: w, height: line ? 6 : 18,
          fill: COLOURS[/** @type {"executable"|"collective"|"line"} */ (s.kind)] || "#999",
        });
        rect.addEventListener("mouseenter", () => {
          tip.textContent = `p${p.rank} ${s.kind} ${s.name}: ${(s.dur / 1e3).toFixed(3)} ms at ${(s.start / 1e3).toFixed(3)} ms`;
        });
        svg.appendChild(rect);
      }
    });
    const axis = el("text", { x: LEFT, y: ROW * procs.length + 20 });
    axis.textContent = `${(x0 / 1e3).toFixed(2)} to ${((x0 + span) / 1e3).toFixed(2)} ms (kernel clock); wheel to zoom, drag to pan`;
    svg.appendChild(axis);
  }

  svg.addEventListener("wheel", (/** @type {WheelEvent} */ ev) => {
    ev.preventDefault();
    const box = svg.getBoundingClientRect();
    const at = view.from + ((ev.clientX - box.left - LEFT) / (width - LEFT - 10)) * (view.to - view.from);
    const k = ev.deltaY > 0 ? 1.25 : 0.8;
    const from = Math.max(0, at - (at - view.from) * k);
    const to = Math.min(1, at + (view.to - at) * k);
    if (to - from > 1e-6) view = { from, to };
    draw();
  });
  let dragging = /** @type {number|null} */ (null);
  svg.addEventListener("mousedown", (ev) => { dragging = ev.clientX; svg.style.cursor = "grabbing"; });
  window.addEventListener("mouseup", () => { dragging = null; svg.style.cursor = "grab"; });
  svg.addEventListener("mousemove", (ev) => {
    if (dragging === null) return;
    const shift = ((dragging - ev.clientX) / (width - LEFT - 10)) * (view.to - view.from);
    dragging = ev.clientX;
    const w = view.to - view.from;
    const from = Math.min(Math.max(0, view.from + shift), 1 - w);
    view = { from, to: from + w };
    draw();
  });
  model.on("change:info", () => { view = { from: 0, to: 1 }; draw(); });
  root.replaceChildren(svg, tip);
  draw();
}

export default { render };
