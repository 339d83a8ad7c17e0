// @ts-check
// Front end of the jaxsys widgets (MeshView, ShardingView, CacheView, LiveDevicesView).
//
// One plain ES module for all four, shipped as package data and loaded by anywidget: there is
// no build step. The Python class sets the `_view_kind` trait and this module picks the
// renderer. Everything drawn comes from the traits, so a saved notebook redraws without a
// kernel. Small layouts are HTML with text labels; large ones (thousands of devices) are
// drawn on a canvas with a hover tooltip, merging cells that would be too small to see.

/**
 * @typedef {object} AnyModel
 * @property {(name: string) => any} get
 * @property {(name: string, value: any) => void} set
 * @property {() => void} save_changes
 * @property {(event: string, cb: () => void) => void} on
 * @property {(event: string, cb?: () => void) => void} off
 */

/**
 * A rectangle to draw on a canvas.
 * @typedef {object} Rect
 * @property {number} x
 * @property {number} y
 * @property {number} w
 * @property {number} h
 * @property {string[]} fills   one colour, or several drawn as vertical stripes
 * @property {string} tip       tooltip text
 * @property {boolean} [faded]  drawn pale (not addressable by the selected process)
 * @property {boolean} [strong] drawn with a dark outline (addressable by the selected process)
 * @property {string} [edge]    outline colour (e.g. the slice of a hybrid mesh)
 */

// Readable with dark text on top; beyond ten processes colours are spread by the golden angle.
const PALETTE = [
  "#8ec5ea", "#f7b26b", "#93d193", "#f19a9a", "#c3a8e0",
  "#d2ad9f", "#f2b6dd", "#c4c4c4", "#dede87", "#8fdbe5",
];
const SLICE_EDGES = ["#1f4e79", "#7a3b00", "#1e5e1e", "#7a1f1f", "#4b2d74", "#5c4033"];
const STATE_COLOURS = {
  alive: "#5cb85c",
  stuck: "#f0ad4e",
  dead: "#d9534f",
  restarting: "#5bc0de",
  unknown: "#b0b0b0",
};
// Below this many pixels per cell, text labels give way to a canvas.
const LABEL_CELL_PX = 40;
// Below this many pixels per cell, neighbouring cells are merged before drawing.
const MIN_CELL_PX = 3;
const MAX_LEGEND = 64;
const MAX_LOG_LINES = 200;

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
function h(tag, props = {}, children = []) {
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

/**
 * Compress sorted integers into "0-3,5" (prefix added).
 * @param {number[]} values
 * @param {string} [prefix]
 * @param {number} [maxParts]
 */
export function formatRanges(values, prefix = "", maxParts = 6) {
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
  if (parts.length > maxParts) {
    return `${prefix}${parts.slice(0, maxParts).join(",")},… (${v.length})`;
  }
  return prefix + parts.join(",");
}

/** @param {number | null | undefined} n */
function formatBytes(n) {
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

/** @param {number | null | undefined} s */
function formatSeconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  return `${(s / 60).toFixed(1)} min`;
}

/** @param {HTMLElement} root */
function widthOf(root) {
  const w = root.clientWidth || root.parentElement?.clientWidth || 0;
  return Math.max(240, Math.min(w || 720, 1100));
}

/**
 * Legend of processes; clicking one calls onPick (when given).
 * @param {number[]} processes
 * @param {number | null} selected
 * @param {((p: number) => void) | null} onPick
 */
function processLegend(processes, selected, onPick) {
  const items = processes.slice(0, MAX_LEGEND).map((p) =>
    h(
      onPick ? "button" : "span",
      {
        class: "jxs-chip" + (p === selected ? " jxs-chip-on" : ""),
        title: onPick ? `highlight what process ${p} holds` : `process ${p}`,
        onclick: onPick ? () => onPick(p) : undefined,
        type: onPick ? "button" : undefined,
      },
      [h("i", { style: { background: processColour(p) } }), `p${p}`],
    ),
  );
  const more = processes.length - MAX_LEGEND;
  /** @type {HTMLElement | null} */
  let picker = null;
  if (more > 0) {
    items.push(h("span", { class: "jxs-muted" }, [`+${more} more`]));
    if (onPick) {
      // Too many processes for chips: a number box reaches the rest.
      picker = h("input", {
        type: "number",
        min: String(processes[0]),
        max: String(processes[processes.length - 1]),
        placeholder: "process #",
        class: "jxs-pick",
        value: selected ?? undefined,
        onchange: (/** @type {Event} */ e) => {
          const v = parseInt(/** @type {HTMLInputElement} */ (e.target).value, 10);
          if (!Number.isNaN(v)) onPick(v);
        },
      });
      items.push(picker);
    }
  }
  return h("div", { class: "jxs-legend" }, items);
}

/**
 * Draw rectangles on a canvas, with a tooltip following the mouse.
 * @param {number} width
 * @param {number} height
 * @param {Rect[]} rects
 */
function canvasOf(width, height, rects) {
  const wrap = h("div", { class: "jxs-canvas-wrap", style: { width: `${width}px` } });
  const canvas = /** @type {HTMLCanvasElement} */ (h("canvas"));
  const ratio = globalThis.devicePixelRatio || 1;
  canvas.width = Math.ceil(width * ratio);
  canvas.height = Math.ceil(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const ctx = canvas.getContext("2d");
  if (ctx) {
    ctx.scale(ratio, ratio);
    for (const r of rects) {
      ctx.globalAlpha = r.faded ? 0.22 : 1;
      const n = r.fills.length;
      for (let k = 0; k < n; k++) {
        ctx.fillStyle = r.fills[k];
        ctx.fillRect(r.x + (r.w * k) / n, r.y, r.w / n, r.h);
      }
      ctx.globalAlpha = 1;
      if (r.w >= 4 && r.h >= 4) {
        ctx.strokeStyle = r.edge || "rgba(0,0,0,0.35)";
        ctx.lineWidth = r.edge ? 2 : 0.5;
        ctx.strokeRect(r.x + 0.25, r.y + 0.25, r.w - 0.5, r.h - 0.5);
      }
      if (r.strong) {
        ctx.strokeStyle = "#111";
        ctx.lineWidth = 2;
        ctx.strokeRect(r.x + 1, r.y + 1, Math.max(r.w - 2, 1), Math.max(r.h - 2, 1));
      }
    }
  }
  const tip = h("div", { class: "jxs-tip" });
  canvas.addEventListener("mousemove", (e) => {
    const box = canvas.getBoundingClientRect();
    const x = e.clientX - box.left;
    const y = e.clientY - box.top;
    const hit = rects.find((r) => x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h);
    if (!hit) {
      tip.style.display = "none";
      return;
    }
    tip.textContent = hit.tip;
    tip.style.display = "block";
    tip.style.left = `${Math.min(x + 12, width - 160)}px`;
    tip.style.top = `${y + 14}px`;
  });
  canvas.addEventListener("mouseleave", () => {
    tip.style.display = "none";
  });
  wrap.append(canvas, tip);
  return wrap;
}

// ------------------------------------------------------------------------------------ mesh

/**
 * How a mesh of any rank is laid out: panels (small multiples) of rows x cols cells.
 * @param {number[]} shape
 * @param {string[]} names
 */
export function meshLayout(shape, names) {
  const nd = shape.length;
  const rows = nd >= 2 ? shape[nd - 2] : 1;
  const cols = nd >= 1 ? shape[nd - 1] : 1;
  const lead = shape.slice(0, Math.max(nd - 2, 0));
  const nPanels = lead.reduce((a, b) => a * b, 1);
  /** @type {string[]} */
  const labels = [];
  for (let p = 0; p < nPanels; p++) {
    let rest = p;
    /** @type {string[]} */
    const parts = [];
    for (let a = lead.length - 1; a >= 0; a--) {
      parts.unshift(`${names[a]}=${rest % lead[a]}`);
      rest = Math.floor(rest / lead[a]);
    }
    labels.push(parts.join(", "));
  }
  // A 4-D mesh puts its two leading axes on a grid of panels; otherwise panels wrap.
  const across = nd === 4 ? shape[1] : null;
  return { rows, cols, labels, across, rowAxis: nd >= 2 ? names[nd - 2] : null,
    colAxis: nd >= 1 ? names[nd - 1] : null };
}

/** @param {AnyModel} model @param {HTMLElement} root */
function renderMesh(model, root) {
  /** @type {any} */
  const info = model.get("info") || {};
  if (!info.devices) {
    root.append(h("div", { class: "jxs-empty" }, ["No mesh yet."]));
    return;
  }
  /** @type {number[]} */
  const shape = info.shape;
  /** @type {string[]} */
  const names = info.axis_names;
  const lay = meshLayout(shape, names);
  const n = info.devices.length;
  const hybrid = Array.isArray(info.slice_index);
  const slices = hybrid ? [...new Set(info.slice_index.filter((s) => s !== null))] : [];

  const axesText = names.map((a, i) => `${a}=${shape[i]}`).join(" × ") || "scalar mesh";
  root.append(
    h("div", { class: "jxs-title" }, [
      h("b", {}, ["Mesh "]),
      `${axesText} · ${n} device${n === 1 ? "" : "s"} on ${info.processes.length} process`
        + `${info.processes.length === 1 ? "" : "es"}`,
      info.platform ? ` · ${info.platform}` : "",
      hybrid ? ` · ${slices.length} slices` : "",
    ]),
  );
  root.append(
    h("div", { class: "jxs-muted" }, [
      lay.rowAxis ? `rows: ${lay.rowAxis}` : "",
      lay.rowAxis && lay.colAxis ? " · " : "",
      lay.colAxis ? `columns: ${lay.colAxis}` : "",
      lay.labels.length > 1 ? ` · one panel per ${names.slice(0, shape.length - 2).join(", ")}` : "",
    ]),
  );

  const width = widthOf(root) - 8;
  const perRow = lay.across ?? Math.max(1, Math.min(lay.labels.length,
    Math.floor(width / (lay.cols * 16 + 24))));
  const cell = Math.max(1, Math.min(64, Math.floor((width / perRow - 20) / lay.cols)));
  const labelled = cell >= LABEL_CELL_PX && n <= 1024;
  const perPanel = lay.rows * lay.cols;

  /** @param {number} flat */
  function describe(flat) {
    const parts = [`device ${info.devices[flat]}`, `process ${info.process[flat]}`];
    if (info.coords && info.coords[flat]) parts.push(`coords (${info.coords[flat].join(",")})`);
    if (hybrid && info.slice_index[flat] !== null) parts.push(`slice ${info.slice_index[flat]}`);
    let rest = flat;
    const pos = shape.map(() => 0);
    for (let a = shape.length - 1; a >= 0; a--) {
      pos[a] = rest % shape[a];
      rest = Math.floor(rest / shape[a]);
    }
    if (shape.length) parts.push(`at ${names.map((a, i) => `${a}=${pos[i]}`).join(", ")}`);
    return parts.join(" · ");
  }
  /** @param {number} flat */
  function sliceEdge(flat) {
    if (!hybrid) return undefined;
    const s = info.slice_index[flat];
    return s === null ? undefined : SLICE_EDGES[s % SLICE_EDGES.length];
  }

  const panels = h("div", {
    class: "jxs-panels",
    style: { gridTemplateColumns: `repeat(${perRow}, max-content)` },
  });
  lay.labels.forEach((label, p) => {
    const base = p * perPanel;
    let body;
    if (labelled) {
      body = h("div", {
        class: "jxs-mesh-grid",
        style: { gridTemplateColumns: `repeat(${lay.cols}, ${cell}px)` },
      });
      for (let k = 0; k < perPanel; k++) {
        const flat = base + k;
        const edge = sliceEdge(flat);
        const coords = info.coords && info.coords[flat] ? info.coords[flat].join(",") : null;
        body.append(
          h(
            "div",
            {
              class: "jxs-cell",
              title: describe(flat),
              style: {
                background: processColour(info.process[flat]),
                height: `${cell}px`,
                outline: edge ? `2px solid ${edge}` : undefined,
              },
            },
            [
              h("b", {}, [String(info.devices[flat])]),
              h("span", {}, [`p${info.process[flat]}`]),
              coords ? h("small", {}, [coords]) : null,
              hybrid && cell >= 52 ? h("small", {}, [`s${info.slice_index[flat]}`]) : null,
            ],
          ),
        );
      }
    } else {
      /** @type {Rect[]} */
      const rects = [];
      for (let k = 0; k < perPanel; k++) {
        const flat = base + k;
        rects.push({
          x: (k % lay.cols) * cell,
          y: Math.floor(k / lay.cols) * cell,
          w: cell,
          h: cell,
          fills: [processColour(info.process[flat])],
          tip: describe(flat),
          edge: sliceEdge(flat),
        });
      }
      body = canvasOf(lay.cols * cell, lay.rows * cell, rects);
    }
    panels.append(h("div", { class: "jxs-panel" }, [
      label ? h("div", { class: "jxs-panel-label" }, [label]) : null, body]));
  });
  root.append(panels);
  root.append(processLegend(info.processes, null, null));
  if (hybrid) {
    root.append(
      h("div", { class: "jxs-legend" }, slices.map((s) =>
        h("span", { class: "jxs-chip" }, [
          h("i", { style: { outline: `2px solid ${SLICE_EDGES[s % SLICE_EDGES.length]}`,
            background: "transparent" } }),
          `slice ${s}`,
        ]),
      )),
    );
  }
}

// -------------------------------------------------------------------------------- sharding

/**
 * Which two dims to draw, given the array's rank and the `dims` trait.
 * @param {number} ndim
 * @param {any} dims
 * @returns {[number | null, number | null]} [row dim, column dim]
 */
export function displayDims(ndim, dims) {
  if (ndim === 0) return [null, null];
  if (ndim === 1) return [null, 0];
  let [r, c] = Array.isArray(dims) && dims.length === 2 ? dims : [0, 1];
  if (!(r >= 0 && r < ndim)) r = 0;
  if (!(c >= 0 && c < ndim) || c === r) c = r === 0 ? 1 : 0;
  return [r, c];
}

/**
 * Label for the devices of a block: "d3", "d0,4", "d0-7 (8)".
 * @param {any} block
 */
function deviceLabel(block) {
  const ids = block.holders.map((/** @type {number[]} */ hd) => hd[0]);
  const text = formatRanges(ids, "d", 2);
  return block.n_holders > ids.length ? `${text} …(${block.n_holders})` : text;
}

/**
 * The text that fits in a block `w` pixels wide: full labels, else counts, else nothing.
 * @param {string} full
 * @param {string} short
 * @param {number} w
 */
function fitLabel(full, short, w) {
  const room = (w - 8) / 6.5; // about 6.5 px per character at 11 px
  if (full.length <= room) return full;
  return short.length <= room ? short : "";
}

/** @param {AnyModel} model @param {HTMLElement} root */
function renderSharding(model, root) {
  /** @type {any} */
  const info = model.get("info") || {};
  if (!info.blocks) {
    root.append(h("div", { class: "jxs-empty" }, ["No sharding yet."]));
    return;
  }
  /** @type {number[]} */
  const shape = info.shape;
  const ndim = shape.length;
  const [rd, cd] = displayDims(ndim, model.get("dims"));
  /** @type {number | null} */
  const selected = model.get("selected_process");

  // Title and caption.
  const dt = info.dtype ? `${info.dtype}` : "array";
  const mesh = info.mesh
    ? ` · mesh ${info.mesh.axis_names.map((/** @type {string} */ a, /** @type {number} */ i) =>
      `${a}=${info.mesh.shape[i]}`).join(" × ")}`
    : "";
  root.append(
    h("div", { class: "jxs-title" }, [
      h("b", {}, [`${dt}[${shape.join(", ")}]`]),
      ` · ${info.sharding} ${info.spec_repr.length > 80 ? "" : info.spec_repr}${mesh}`,
    ]),
  );
  const rep = info.replicas > 1 ? `, each on ${info.replicas} devices (replicated ×${info.replicas})` : "";
  root.append(
    h("div", { class: "jxs-muted" }, [
      `${info.num_blocks} distinct shard${info.num_blocks === 1 ? "" : "s"} of shape `
        + `[${info.shard_shape.join(", ")}]${rep} · ${info.num_devices} devices on `
        + `${info.processes.length} process${info.processes.length === 1 ? "" : "es"}`,
    ]),
  );
  const others = shape.map((_, d) => d).filter((d) => d !== rd && d !== cd);
  if (others.length) {
    const parts = others.map((d) => `dim ${d}: ${info.grid[d]} block${info.grid[d] === 1 ? "" : "s"}`);
    root.append(h("div", { class: "jxs-muted" }, [
      `not drawn — ${parts.join(", ")}; shown: the first block of each`,
    ]));
  }
  if (info.aggregated) {
    root.append(h("div", { class: "jxs-note" }, [
      `aggregated: ${info.num_blocks} shards merged ${info.factor.join(" × ")} per dim `
        + `into ${info.blocks.length} blocks`,
    ]));
  }

  // Dim pickers for arrays of rank 3 and more.
  if (ndim > 2) {
    /** @param {string} label @param {number} value @param {(v: number) => void} set */
    const pick = (label, value, set) =>
      h("label", {}, [
        label,
        h(
          "select",
          { onchange: (/** @type {Event} */ e) =>
            set(parseInt(/** @type {HTMLSelectElement} */ (e.target).value, 10)) },
          shape.map((n, d) => {
            const o = h("option", { value: String(d) }, [`dim ${d} (${n})`]);
            if (d === value) o.setAttribute("selected", "");
            return o;
          }),
        ),
      ]);
    const setDims = (/** @type {number} */ r, /** @type {number} */ c) => {
      if (r === c) c = shape.findIndex((_, d) => d !== r);
      model.set("dims", [r, c]);
      model.save_changes();
    };
    root.append(h("div", { class: "jxs-controls" }, [
      pick("rows ", /** @type {number} */ (rd), (v) => setDims(v, /** @type {number} */ (cd))),
      pick(" columns ", /** @type {number} */ (cd), (v) => setDims(/** @type {number} */ (rd), v)),
    ]));
  }

  // Geometry: blocks placed by their element ranges, so uneven merges keep proportions.
  const rowEdges = rd === null ? [0, 1] : info.edges[rd];
  const colEdges = cd === null ? [0, 1] : info.edges[cd];
  const R = rowEdges.length - 1;
  const C = colEdges.length - 1;
  const W = Math.max(160, Math.min(widthOf(root) - 60, 760));
  const rowsN = rd === null ? 1 : shape[rd] || 1;
  const colsN = cd === null ? 1 : shape[cd] || 1;
  let H;
  if (rd === null) H = cd === null ? 80 : 64;
  else H = Math.max(48, Math.min(480, Math.max((W * rowsN) / colsN, Math.min(R * 34, 480))));
  const span = (/** @type {number[]} */ e) => (e[e.length - 1] - e[0]) || 1;
  const xAt = (/** @type {number} */ v) => ((v - colEdges[0]) / span(colEdges)) * W;
  const yAt = (/** @type {number} */ v) => ((v - rowEdges[0]) / span(rowEdges)) * H;
  const shown = info.blocks.filter((/** @type {any} */ b) =>
    others.every((d) => b.cell[d] === 0));

  /** @param {any} b */
  const geom = (b) => {
    const ri = rd === null ? 0 : b.cell[rd];
    const ci = cd === null ? 0 : b.cell[cd];
    return { ri, ci, x: xAt(colEdges[ci]), y: yAt(rowEdges[ri]),
      w: xAt(colEdges[ci + 1]) - xAt(colEdges[ci]), h: yAt(rowEdges[ri + 1]) - yAt(rowEdges[ri]) };
  };
  /** @param {any} b */
  const rangeText = (b) =>
    b.index.map((/** @type {number[]} */ r) => `${r[0]}:${r[1]}`).join(", ");
  /** @param {any} b */
  const tipOf = (b) =>
    `[${rangeText(b)}] · ${deviceLabel(b)} · ${formatRanges(b.addressable_by, "p")}`
    + (b.replicas > 1 ? ` · ×${b.replicas} replicated` : "")
    + (b.merged > 1 ? ` · ${b.merged} shards merged` : "");

  let minW = Infinity;
  let minH = Infinity;
  for (let i = 0; i < C; i++) minW = Math.min(minW, xAt(colEdges[i + 1]) - xAt(colEdges[i]));
  for (let i = 0; i < R; i++) minH = Math.min(minH, yAt(rowEdges[i + 1]) - yAt(rowEdges[i]));

  /** @type {HTMLElement} */
  let drawing;
  if (minW >= 44 && minH >= 26 && shown.length <= 1024) {
    drawing = h("div", { class: "jxs-blocks", style: { width: `${W}px`, height: `${H}px` } });
    for (const b of shown) {
      const g = geom(b);
      const procs = b.addressable_by;
      const on = selected !== null && procs.includes(selected);
      const fills = procs.slice(0, 4).map(processColour);
      const bg = fills.length === 1 ? fills[0]
        : `repeating-linear-gradient(135deg, ${fills.map((f, k) =>
          `${f} ${k * 8}px, ${f} ${(k + 1) * 8}px`).join(", ")})`;
      drawing.append(h("div", {
        class: "jxs-block" + (on ? " jxs-on" : "") + (selected !== null && !on ? " jxs-off" : ""),
        title: tipOf(b),
        style: { left: `${g.x}px`, top: `${g.y}px`, width: `${g.w}px`, height: `${g.h}px`,
          background: bg },
      }, [
        h("span", {}, [fitLabel(deviceLabel(b), `${b.n_holders} dev`, g.w)]),
        g.h >= 40
          ? h("small", {}, [fitLabel(formatRanges(procs, "p", 2), `${procs.length} proc`, g.w)])
          : null,
        b.replicas > 1 && g.w >= 60 ? h("em", { class: "jxs-badge" }, [`×${b.replicas}`]) : null,
      ]));
    }
  } else {
    // Merge neighbouring cells until each is at least MIN_CELL_PX on screen.
    const br = Math.max(1, Math.ceil(MIN_CELL_PX / Math.max(minH, 1e-9)));
    const bc = Math.max(1, Math.ceil(MIN_CELL_PX / Math.max(minW, 1e-9)));
    /** @type {Map<string, {ri: number, ci: number, procs: Set<number>, n: number, blocks: any[]}>} */
    const bins = new Map();
    for (const b of shown) {
      const g = geom(b);
      const key = `${Math.floor(g.ri / br)},${Math.floor(g.ci / bc)}`;
      let bin = bins.get(key);
      if (!bin) {
        bin = { ri: Math.floor(g.ri / br), ci: Math.floor(g.ci / bc), procs: new Set(), n: 0,
          blocks: [] };
        bins.set(key, bin);
      }
      b.addressable_by.forEach((/** @type {number} */ p) => bin.procs.add(p));
      bin.n += b.n_holders;
      if (bin.blocks.length < 1) bin.blocks.push(b);
    }
    /** @type {Rect[]} */
    const rects = [];
    for (const bin of bins.values()) {
      const r0 = bin.ri * br;
      const c0 = bin.ci * bc;
      const r1 = Math.min(r0 + br, R);
      const c1 = Math.min(c0 + bc, C);
      const procs = [...bin.procs].sort((a, b) => a - b);
      const on = selected !== null && bin.procs.has(selected);
      const single = br * bc === 1 ? bin.blocks[0] : null;
      rects.push({
        x: xAt(colEdges[c0]),
        y: yAt(rowEdges[r0]),
        w: xAt(colEdges[c1]) - xAt(colEdges[c0]),
        h: yAt(rowEdges[r1]) - yAt(rowEdges[r0]),
        fills: procs.slice(0, 4).map(processColour),
        faded: selected !== null && !on,
        strong: on,
        tip: single ? tipOf(single)
          : [
            rd === null ? null : `dim ${rd} ${rowEdges[r0]}:${rowEdges[r1]}`,
            cd === null ? null : `dim ${cd} ${colEdges[c0]}:${colEdges[c1]}`,
            `${bin.n} devices`,
            formatRanges(procs, "p"),
          ].filter(Boolean).join(" · "),
      });
    }
    drawing = canvasOf(W, H, rects);
    if (br * bc > 1) {
      root.append(h("div", { class: "jxs-note" }, [
        `drawn merged ${br} × ${bc} blocks per cell to stay readable; hover for details`,
      ]));
    }
  }

  // Axis captions and ticks (ticks only when they fit).
  const top = h("div", { class: "jxs-axis-top", style: { width: `${W}px` } }, [
    cd === null ? "" : `dim ${cd} →`,
  ]);
  if (cd !== null && C <= 16) {
    colEdges.forEach((/** @type {number} */ v) => top.append(h("span", {
      class: "jxs-tick", style: { left: `${xAt(v)}px` } }, [String(v)])));
  }
  const left = h("div", { class: "jxs-axis-left", style: { height: `${H}px` } }, [
    rd === null ? "" : `dim ${rd} ↓`,
  ]);
  if (rd !== null && R <= 16) {
    rowEdges.forEach((/** @type {number} */ v) => left.append(h("span", {
      class: "jxs-tick", style: { top: `${yAt(v)}px` } }, [String(v)])));
  }
  root.append(h("div", { class: "jxs-plot" }, [h("div"), top, left, drawing]));

  root.append(processLegend(info.processes, selected, (p) => {
    model.set("selected_process", p === model.get("selected_process") ? null : p);
    model.save_changes();
  }));
  if (selected !== null) {
    const held = shown.filter((/** @type {any} */ b) => b.addressable_by.includes(selected));
    root.append(h("div", { class: "jxs-muted" }, [
      `process ${selected} holds ${held.length} of the ${shown.length} blocks drawn `
        + "(click it again to clear)",
    ]));
  }
}

// ----------------------------------------------------------------------------------- cache

/** @param {any} s */
function savedText(s) {
  const exact = s.time_saved ?? 0;
  if (!s.unmeasured_hits) return formatSeconds(exact);
  // Entries jaxsys has no record of: JAX keeps only whole seconds, so this is a lower bound.
  return `≥ ${formatSeconds(exact + (s.time_saved_at_least ?? 0))}`;
}

/** @param {any[]} stats */
function thresholdsText(stats) {
  /** @type {Record<string, number[]>} */
  const groups = {};
  for (const s of stats) {
    if (s.min_compile_secs === null || s.min_compile_secs === undefined) continue;
    const size = s.min_entry_bytes > 0 ? `≥ ${s.min_entry_bytes} bytes` : "any size";
    const key = `written when compiled in ≥ ${s.min_compile_secs} s, ${size}`;
    (groups[key] = groups[key] || []).push(s.rank);
  }
  const keys = Object.keys(groups);
  if (keys.length === 1) return keys[0];
  return keys.map((k) => `${formatRanges(groups[k], "p", 8)}: ${k}`).join("; ");
}

/** @param {AnyModel} model @param {HTMLElement} root */
function renderCache(model, root) {
  /** @type {any[]} */
  const stats = model.get("stats") || [];
  root.append(h("div", { class: "jxs-title" }, [h("b", {}, ["Compilation cache"])]));
  if (!stats.length) {
    root.append(h("div", { class: "jxs-empty" }, ["No cache statistics yet."]));
    return;
  }
  const dirs = [...new Set(stats.map((s) => s.cache_dir).filter(Boolean))];
  root.append(h("div", { class: "jxs-muted" }, [
    `directory: ${dirs.join(", ") || "none"} · ${thresholdsText(stats) || "thresholds not reported yet"}`,
  ]));
  const head = ["process", "served", "requests", "hits", "misses", "hit rate", "shared",
    "compiled here", "compile time", "time saved", "reading", "entries", "size", "last functions"];
  /** @param {any} s @param {string} label */
  const row = (s, label) => {
    const req = s.requests ?? 0;
    const hits = s.hits ?? 0;
    const misses = s.misses ?? req - hits;
    const rate = s.hit_rate ?? (req ? hits / req : 0);
    const last = s.last_functions || [];
    const served = s.served === undefined || s.served === null ? "—" : (s.served ? "yes" : "no");
    return h("tr", {}, [
      h("td", {}, [label]),
      h("td", { title: s.why_not || "" }, [served]),
      h("td", { class: "jxs-num" }, [String(req)]),
      h("td", { class: "jxs-num" }, [String(hits)]),
      h("td", { class: "jxs-num" }, [String(misses)]),
      h("td", {}, [
        h("span", { class: "jxs-bar" }, [h("i", { style: { width: `${Math.round(rate * 100)}%` } })]),
        ` ${req ? Math.round(rate * 100) + "%" : "—"}`,
      ]),
      h("td", { class: "jxs-num" }, [String(s.shared ?? 0)]),
      h("td", { class: "jxs-num" }, [String(s.compiles ?? 0)]),
      h("td", { class: "jxs-num" }, [formatSeconds(s.compile_time)]),
      h("td", { class: "jxs-num" }, [savedText(s)]),
      h("td", { class: "jxs-num" }, [formatSeconds(s.retrieval_time)]),
      h("td", { class: "jxs-num" }, [String(s.entries ?? 0)]),
      h("td", { class: "jxs-num" }, [formatBytes(s.bytes)]),
      h("td", { class: "jxs-fns", title: last.join("\n") }, [
        (last.length > 3 ? "…, " : "") + last.slice(-3).join(", "),
      ]),
    ]);
  };
  const body = h("tbody", {}, stats.map((s) =>
    row(s, s.rank === undefined ? "?" : `p${s.rank}`)));
  if (stats.length > 1) {
    /** @param {string} k */
    const sum = (k) => stats.reduce((a, s) => a + (s[k] ?? 0), 0);
    const total = {
      requests: sum("requests"), hits: sum("hits"), shared: sum("shared"),
      compiles: sum("compiles"), compile_time: sum("compile_time"),
      time_saved: sum("time_saved"), time_saved_at_least: sum("time_saved_at_least"),
      unmeasured_hits: sum("unmeasured_hits"), retrieval_time: sum("retrieval_time"),
      entries: Math.max(...stats.map((s) => s.entries ?? 0)),
      bytes: Math.max(...stats.map((s) => s.bytes ?? 0)), last_functions: [],
    };
    const tr = row(total, "all");
    tr.className = "jxs-total";
    body.append(tr);
  }
  root.append(h("table", { class: "jxs-table" }, [
    h("thead", {}, [h("tr", {}, head.map((t) => h("th", {}, [t])))]),
    body,
  ]));
  // Why a process is not served, in words, once per distinct reason.
  /** @type {Record<string, number[]>} */
  const reasons = {};
  for (const s of stats) {
    if (s.served === false && s.why_not) (reasons[s.why_not] = reasons[s.why_not] || []).push(s.rank);
  }
  for (const [why, ranks] of Object.entries(reasons)) {
    root.append(h("div", { class: "jxs-note jxs-cache-why" }, [
      `${formatRanges(ranks, "p", 8)}: ${why}.`,
    ]));
  }
  // Miss reasons, on demand.
  const withMisses = stats.filter((s) => (s.last_misses || []).length);
  if (withMisses.length) {
    root.append(h("details", { class: "jxs-misses" }, [
      h("summary", {}, ["why requests missed (newest last; %jaxsys cache misses lists more)"]),
      ...withMisses.map((s) => h("div", {}, [
        h("b", {}, [`p${s.rank}`]),
        h("ul", {}, (s.last_misses || []).map((/** @type {string} */ m) => h("li", {}, [m]))),
      ])),
    ]));
  }
}

// ------------------------------------------------------------------------------------ live

/** A process's logged transfers, once its transfer guard has logged any.
 * @param {Record<string, number>|undefined} counts */
function transfersText(counts) {
  if (!counts || !Object.keys(counts).length) return null;
  const part = (/** @type {string} */ kind, /** @type {string} */ short) => `${counts[kind] || 0} ${short}`;
  return h("span", {
    class: "jxs-muted jxs-transfers",
    title: "transfers this process's transfer guard logged (%jaxsys transfer-guard)",
  }, [`⇄ ${part("host-to-device", "h2d")} · ${part("device-to-host", "d2h")} · ${part("device-to-device", "d2d")}`]);
}

/** @param {AnyModel} model @param {HTMLElement} root */
function renderLive(model, root) {
  /** @type {any[]} */
  const live = model.get("liveness") || [];
  /** @type {string[]} */
  const log = model.get("event_log") || [];
  const counts = /** @type {Record<string, number>} */ ({});
  for (const p of live) counts[p.state || "unknown"] = (counts[p.state || "unknown"] || 0) + 1;
  root.append(h("div", { class: "jxs-title" }, [
    h("b", {}, ["Processes"]),
    live.length ? ` · ${Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ")}` : "",
  ]));
  root.append(h("div", { class: "jxs-legend" }, Object.entries(STATE_COLOURS).map(([k, c]) =>
    h("span", { class: "jxs-chip" }, [h("i", { style: { background: c } }), k]))));
  if (!live.length) {
    root.append(h("div", { class: "jxs-empty" }, ["No heartbeats yet."]));
  }
  // Controls are served by the kernel on a subshell, so they work while a cell blocks.
  const controls = Boolean(model.get("controls"));
  /** @param {string} label @param {string} title @param {string} action @param {number|null} rank */
  const control = (label, title, action, rank) => h("button", {
    class: "jxs-button",
    title,
    "data-action": action,
    "data-rank": rank === null ? "" : String(rank),
    onclick: () => model.send({ action, rank }),
  }, [label]);
  if (controls) {
    root.append(h("div", { class: "jxs-controls jxs-controls-bar" }, [
      control("stop cell", "interrupt the running cell on every process", "stop", null),
      control("dump stacks", "Python stacks of every process", "stacks", null),
      control("restart world", "replace every process and re-initialise JAX", "restart-world", null),
      h("span", { class: "jxs-muted jxs-control-status" }, [model.get("control_status") || ""]),
    ]));
  }
  const compact = live.length > 64;
  const grid = h("div", { class: compact ? "jxs-live jxs-live-compact" : "jxs-live" });
  for (const p of live) {
    const state = p.state || "unknown";
    const colour = STATE_COLOURS[/** @type {keyof STATE_COLOURS} */ (state)] || STATE_COLOURS.unknown;
    const age = p.heartbeat_age;
    const tip = `process ${p.rank} · ${state} · heartbeat ${formatSeconds(age)} ago`
      + ` · incarnation ${p.incarnation ?? 0}${p.busy ? " · busy" : ""}`
      + ` · devices ${formatRanges(p.devices || [], "", 8) || "—"}`;
    const devs = (p.devices || []).map((/** @type {number} */ d) =>
      h("i", { class: "jxs-dev", title: `device ${d} · ${tip}`, style: { background: colour } },
        [compact ? "" : String(d)]));
    if (!devs.length) devs.push(h("i", { class: "jxs-dev", title: tip, style: { background: colour } }));
    if (compact) {
      grid.append(h("span", { class: "jxs-live-tile", title: tip }, devs));
      continue;
    }
    grid.append(h("div", { class: "jxs-live-row", title: tip }, [
      h("span", { class: "jxs-live-name" }, [`p${p.rank}`]),
      h("span", { class: "jxs-state", style: { background: colour } }, [state]),
      h("span", { class: "jxs-age" + (age !== null && age !== undefined && age > 5 ? " jxs-late" : "") },
        [`♥ ${formatSeconds(age)}`]),
      h("span", { class: "jxs-muted" }, [`inc ${p.incarnation ?? 0}${p.busy ? " · busy" : ""}`]),
      h("span", { class: "jxs-devs" }, devs),
      transfersText(p.transfers),
      controls ? h("span", { class: "jxs-controls" }, [
        control("stacks", "dump this process's Python stacks", "stacks", p.rank),
        control("kill", "SIGKILL this process", "kill", p.rank),
        control("restart", "replace this process; it rejoins the JAX world", "restart", p.rank),
      ]) : null,
    ]));
  }
  root.append(grid);
  const health = model.get("telemetry_health") || "";
  if (health) root.append(h("div", { class: "jxs-muted jxs-telemetry-health" }, [health]));
  root.append(h("div", { class: "jxs-muted" }, [`event log (${log.length})`]));
  if (!log.length) return;
  const box = h("div", { class: "jxs-log" }, log.slice(-MAX_LOG_LINES).map((line) =>
    h("div", {}, [line])));
  root.append(box);
  // Newest at the bottom: keep it in view once the element is laid out.
  requestAnimationFrame(() => {
    box.scrollTop = box.scrollHeight;
  });
}

// ---------------------------------------------------------------------------------- entry

/** @type {Record<string, {draw: (m: AnyModel, r: HTMLElement) => void, traits: string[]}>} */
const VIEWS = {
  mesh: { draw: renderMesh, traits: ["info"] },
  sharding: { draw: renderSharding, traits: ["info", "dims", "selected_process"] },
  cache: { draw: renderCache, traits: ["stats"] },
  live: { draw: renderLive, traits: ["liveness", "event_log", "controls", "control_status", "telemetry_health"] },
};

export default {
  /** @param {{model: AnyModel, el: HTMLElement}} ctx */
  render({ model, el }) {
    const kind = model.get("_view_kind");
    const view = VIEWS[kind];
    const root = h("div", { class: `jxs-root jxs-${kind}` });
    el.append(root);
    if (!view) {
      root.append(h("div", { class: "jxs-empty" }, [`unknown jaxsys view ${kind}`]));
      return () => root.remove();
    }
    let pending = false;
    let lastWidth = 0;
    const draw = () => {
      pending = false;
      lastWidth = root.clientWidth;
      root.replaceChildren();
      try {
        view.draw(model, root);
      } catch (err) {
        root.replaceChildren(h("pre", { class: "jxs-error" }, [`jaxsys view failed: ${err}`]));
      }
    };
    // Several traits arrive in one message; coalesce their change events into one redraw.
    const schedule = () => {
      if (pending) return;
      pending = true;
      requestAnimationFrame(draw);
    };
    draw();
    for (const t of view.traits) model.on(`change:${t}`, schedule);
    // The first draw may happen before the output is attached (width 0): redraw on resize.
    const ro = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(() => {
      if (Math.abs(root.clientWidth - lastWidth) > 24) schedule();
    });
    ro?.observe(root);
    return () => {
      for (const t of view.traits) model.off(`change:${t}`, schedule);
      ro?.disconnect();
      root.remove();
    };
  },
};
