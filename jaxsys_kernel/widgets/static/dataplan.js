// @ts-check
// Front end of DataPlanView: which process reads which block of a global batch.
//
// Plain ES module loaded by anywidget, styled by views.css so blocks, chips and captions look
// like the sharding view, with the same colour per process. Everything drawn comes from the
// `info` trait (a "dataplan" summary) and `selected_process`; a saved notebook redraws
// without a kernel.

/**
 * @typedef {object} AnyModel
 * @property {(name: string) => any} get
 * @property {(name: string, value: any) => void} set
 * @property {() => void} save_changes
 * @property {(event: string, cb: () => void) => void} on
 * @property {(event: string, cb?: () => void) => void} off
 */

// ---- from shared.js: PALETTE, processColour, h, formatBytes
// (written by jaxsys_kernel.widgets.esm.write_copies(): edit shared.js, not here)
// Readable with dark text on top; beyond ten processes colours are spread by the golden angle.
export const PALETTE = [
  "#8ec5ea", "#f7b26b", "#93d193", "#f19a9a", "#c3a8e0",
  "#d2ad9f", "#f2b6dd", "#c4c4c4", "#dede87", "#8fdbe5",
];

/** @param {number} p */
export function processColour(p) {
  if (p >= 0 && p < PALETTE.length) return PALETTE[p];
  return `hsl(${Math.round((p * 137.508) % 360)}, 55%, 72%)`;
}

/**
 * Tiny DOM builder.
 * @param {string} tag
 * @param {Record<string, any>} [props]
 * @param {(Node | string | null | undefined | false)[]} [children]
 * @returns {HTMLElement}
 */
export function h(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k === "style") Object.assign(node.style, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    node.append(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return node;
}

/** @param {number | null | undefined} n */
export function formatBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let x = n;
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i++;
  }
  return `${i === 0 ? x : x.toFixed(1)} ${units[i]}`;
}
// ---- end of shared.js

const STRATEGY_TEXT = {
  process: "one reader per process",
  device: "one reader per device",
  all: "every process reads everything",
};
// Blocks drawn as labelled boxes up to this many; beyond, plain coloured cells.
const MAX_LABELLED = 256;
// Per-process rows listed; the rest are summed up.
const MAX_ROWS = 32;
const MINI_W = 120;
const MINI_H = 36;

/**
 * Sorted ids with runs collapsed: "p0-3", "d0,2048".
 * @param {number[]} values
 * @param {string} prefix
 */
export function formatIds(values, prefix) {
  const v = [...new Set(values)].sort((a, b) => a - b);
  /** @type {string[]} */
  const parts = [];
  let i = 0;
  while (i < v.length) {
    let j = i;
    while (j + 1 < v.length && v[j + 1] === v[j] + 1) j++;
    parts.push(j > i ? `${v[i]}-${v[j]}` : `${v[i]}`);
    i = j + 1;
  }
  return prefix + parts.join(",");
}

/** @param {number[][]} index */
const indexText = (index) => `[${index.map((r) => `${r[0]}:${r[1]}`).join(", ")}]`;

/** Whether a box is the first along every dim past the two drawn. @param {number[][]} index */
const firstAlongRest = (index) => index.slice(2).every((r) => r[0] === 0);

/**
 * Pixel geometry of the drawn dims (0 and 1; a 1-D batch is one row).
 * @param {number[]} shape
 * @param {number} width
 * @param {number} maxHeight
 */
export function geometry(shape, width, maxHeight) {
  const two = shape.length >= 2;
  const nr = (two ? shape[0] : 1) || 1;
  const nc = (two ? shape[1] : shape[0] ?? 1) || 1;
  const height = two ? Math.max(28, Math.min((width * nr) / nc, maxHeight)) : 28;
  /** @param {number[][]} index */
  const box = (index) => {
    const [r0, r1] = two ? index[0] : [0, 1];
    const [c0, c1] = two ? index[1] : index[0] ?? [0, 1];
    const sr = two ? nr : 1;
    return { x: (c0 / nc) * width, y: (r0 / sr) * height,
      w: ((c1 - c0) / nc) * width, h: ((r1 - r0) / sr) * height };
  };
  return { width, height, box };
}

/** Background of a block read by several processes: stripes. @param {number[]} procs */
function fillOf(procs) {
  const fills = (procs.length ? procs : [0]).slice(0, 4).map(processColour);
  if (fills.length === 1) return fills[0];
  return `repeating-linear-gradient(135deg, ${fills.map((f, k) =>
    `${f} ${k * 8}px, ${f} ${(k + 1) * 8}px`).join(", ")})`;
}

/** @param {any} info @param {number | null} selected @param {number} W */
function mainMap(info, selected, W) {
  const g = geometry(info.shape, W, 320);
  const shown = info.blocks.filter((/** @type {any} */ b) => firstAlongRest(b.index));
  const drawing = h("div", { class: "jxs-blocks", style: { width: `${W}px`, height: `${g.height}px` } });
  const labelled = shown.length <= MAX_LABELLED;
  for (const b of shown) {
    const r = g.box(b.index);
    const on = selected !== null && b.readers.includes(selected);
    const label = formatIds(b.readers, "p");
    drawing.append(h("div", {
      class: "jxs-block" + (on ? " jxs-on" : "") + (selected !== null && !on ? " jxs-off" : ""),
      title: `${indexText(b.index)} · on ${formatIds(b.holders.map((/** @type {number[]} */ x) =>
        x[0]), "d")} · read by ${label}`
        + (b.holders.length > 1 ? ` · ×${b.holders.length} replicated` : ""),
      style: { left: `${r.x}px`, top: `${r.y}px`, width: `${r.w}px`, height: `${r.h}px`,
        background: fillOf(b.readers) },
    }, [
      labelled && r.w >= 7 * label.length + 8 && r.h >= 16 ? h("span", {}, [label]) : null,
      labelled && b.holders.length > 1 && r.w >= 60 && r.h >= 30
        ? h("em", { class: "jxs-badge" }, [`×${b.holders.length}`]) : null,
    ]));
  }
  if (selected !== null) {
    // The selected process's reads, outlined: what one pipeline of that process fetches.
    const proc = info.processes.find((/** @type {any} */ p) => p.process === selected);
    for (const read of proc ? proc.reads : []) {
      if (!firstAlongRest(read.index)) continue;
      const r = g.box(read.index);
      drawing.append(h("div", {
        class: "jxs-read",
        title: `p${selected} reads ${indexText(read.index)}: ${formatBytes(read.nbytes)}`,
        style: { position: "absolute", left: `${r.x}px`, top: `${r.y}px`, width: `${r.w}px`,
          height: `${r.h}px`, boxSizing: "border-box", border: "2px dashed #111",
          pointerEvents: "none", zIndex: "2" },
      }));
    }
  }
  const top = h("div", { class: "jxs-axis-top", style: { width: `${W}px` } },
    [info.shape.length >= 2 ? "dim 1 →" : "dim 0 →"]);
  const left = h("div", { class: "jxs-axis-left", style: { height: `${g.height}px` } },
    [info.shape.length >= 2 ? "dim 0 ↓" : ""]);
  return h("div", { class: "jxs-plot" }, [h("div"), top, left, drawing]);
}

/** @param {any} info @param {any} p @param {number} barMax @param {boolean} on @param {() => void} pick */
function processRow(info, p, barMax, on, pick) {
  const colour = processColour(p.process);
  const g = geometry(info.shape, MINI_W, MINI_H);
  const mini = h("div", { class: "jxs-blocks", style: { width: `${MINI_W}px`, height: `${g.height}px`,
    background: "var(--jp-layout-color2, #f4f4f4)", border: "1px solid #999" } });
  for (const read of p.reads) {
    if (!firstAlongRest(read.index)) continue;
    const r = g.box(read.index);
    mini.append(h("div", {
      class: "jxs-block",
      title: `${indexText(read.index)} · ${formatBytes(read.nbytes)} · ${read.runs} run(s)`
        + ` · feeds ${formatIds(read.devices, "d")}`
        + (read.shared_with.length ? ` · also read by ${formatIds(read.shared_with, "p")}` : ""),
      style: { left: `${r.x}px`, top: `${r.y}px`, width: `${r.w}px`, height: `${r.h}px`,
        background: colour },
    }));
  }
  const share = info.nbytes ? p.nbytes / info.nbytes : 0;
  const shared = [...new Set(p.reads.flatMap((/** @type {any} */ r) => r.shared_with))];
  const n = p.reads.length;
  return h("div", {
    class: "jxs-dp-row",
    style: { display: "flex", alignItems: "center", gap: "10px", margin: "3px 0",
      cursor: "pointer", fontWeight: on ? "600" : "normal" },
    title: `click to ${on ? "clear" : "highlight"} what p${p.process} reads`,
    onclick: pick,
  }, [
    h("span", { class: "jxs-chip" + (on ? " jxs-chip-on" : "") },
      [h("i", { style: { background: colour } }), `p${p.process}`]),
    mini,
    h("span", { style: { display: "inline-block", width: "160px" } }, [
      h("i", { style: { display: "block", height: "12px", background: colour,
        border: "1px solid rgba(0,0,0,0.4)", boxSizing: "border-box",
        width: `${Math.max(1, barMax ? (160 * p.nbytes) / barMax : 0)}px` } }),
    ]),
    h("span", {}, [
      `${formatBytes(p.nbytes)} (${Math.round(share * 100)}%) · ${n} read${n === 1 ? "" : "s"}, `
        + `${p.runs} run${p.runs === 1 ? "" : "s"}`
        + (shared.length ? ` · same data as ${formatIds(shared, "p")}` : ""),
    ]),
  ]);
}

/** @param {AnyModel} model @param {HTMLElement} root */
export function renderPlan(model, root) {
  /** @type {any} */
  const info = model.get("info") || {};
  if (!info.blocks) {
    root.append(h("div", { class: "jxs-empty" }, ["No data plan yet."]));
    return;
  }
  /** @type {number | null} */
  const selected = model.get("selected_process");
  /** @param {number} p */
  const pick = (p) => {
    model.set("selected_process", p === model.get("selected_process") ? null : p);
    model.save_changes();
  };
  const strategy = STRATEGY_TEXT[/** @type {keyof STRATEGY_TEXT} */ (info.strategy)] || info.strategy;
  root.append(h("div", { class: "jxs-title" }, [
    h("b", {}, [`${info.dtype}[${info.shape.join(", ")}]`]),
    ` · ${formatBytes(info.nbytes)} · ${info.sharding} · ${strategy}`,
  ]));
  const amp = info.nbytes ? info.total_read / info.nbytes : 0;
  root.append(h("div", { class: "jxs-muted" }, [
    `read in total ${formatBytes(info.total_read)} = ${amp.toFixed(2)} × the batch, by `
      + `${info.processes.length} process${info.processes.length === 1 ? "" : "es"}; `
      + "each block is coloured by the processes that read it",
  ]));
  if (info.shape.length > 2) {
    root.append(h("div", { class: "jxs-muted" }, [
      "dims past 1 not drawn; shown: the first block along each",
    ]));
  }
  const W = Math.max(200, Math.min((root.clientWidth || 720) - 80, 560));
  root.append(mainMap(info, selected, W));
  const barMax = Math.max(0, ...info.processes.map((/** @type {any} */ p) => p.nbytes));
  const rows = h("div", { class: "jxs-dp-rows" });
  for (const p of info.processes.slice(0, MAX_ROWS)) {
    rows.append(processRow(info, p, barMax, p.process === selected, () => pick(p.process)));
  }
  const more = info.processes.length - MAX_ROWS;
  if (more > 0) rows.append(h("div", { class: "jxs-muted" }, [`… ${more} more processes`]));
  root.append(rows);
}

export default {
  /** @param {{model: AnyModel, el: HTMLElement}} ctx */
  render({ model, el }) {
    const root = h("div", { class: "jxs-root jxs-dataplan" });
    el.append(root);
    let pending = false;
    const draw = () => {
      pending = false;
      root.replaceChildren();
      try {
        renderPlan(model, root);
      } catch (err) {
        root.replaceChildren(h("pre", { class: "jxs-error" }, [`jaxsys view failed: ${err}`]));
      }
    };
    const schedule = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(draw);
    };
    draw();
    const traits = ["info", "selected_process"];
    for (const t of traits) model.on(`change:${t}`, schedule);
    return () => {
      for (const t of traits) model.off(`change:${t}`, schedule);
      root.remove();
    };
  },
};
