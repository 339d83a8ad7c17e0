// @ts-check
// ShardingView: an array's global shape split into the blocks its devices hold.
// Python inlines shared.js in place of the import below (see shared.js for why).
import { MIN_CELL_PX, canvasOf, formatRanges, h, mount, processColour, processLegend, widthOf } from "./shared.js";

/** @typedef {import("./shared.js").AnyModel} AnyModel */

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

// The size a drawn block would like: room for a device label, a process label and a badge.
const BLOCK_W = 96;
const BLOCK_H = 52;
// Rows of blocks are never squeezed below this (unless there are too many to fit at all).
const MIN_BLOCK_H = 30;
const MAX_W = 760;
const MAX_H = 480;

/**
 * The drawing's size in pixels: as big as its blocks need, not as big as the output area.
 * The width gives each of the C columns of blocks BLOCK_W (within [120, min(room, MAX_W)]);
 * the height follows the array's proportions, kept between MIN_BLOCK_H and BLOCK_H per row
 * of blocks, so a 4 x 4 array fully split is 384 x 208, not a 760 x 480 poster.
 * @param {number} R rows of blocks
 * @param {number} C columns of blocks
 * @param {number | null} rowsN elements along the row dim (null: one row, a 1-D or 0-D array)
 * @param {number} colsN elements along the column dim
 * @param {number} room pixels available
 * @returns {[number, number]} [width, height]
 */
export function plotSize(R, C, rowsN, colsN, room) {
  const W = Math.round(Math.max(120, Math.min(C * BLOCK_W, room, MAX_W)));
  if (rowsN === null) return [W, BLOCK_H];
  const wanted = (W * rowsN) / colsN;
  const H = Math.max(R * MIN_BLOCK_H, Math.min(R * BLOCK_H, wanted));
  return [W, Math.round(Math.max(48, Math.min(MAX_H, H)))];
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
  const room = (w - 8) / 7; // about 7 px per character at 12 px
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
  const held = `${info.num_devices} device${info.num_devices === 1 ? "" : "s"} on `
    + `${info.processes.length} process${info.processes.length === 1 ? "" : "es"}`;
  // A scalar has no shards to speak of, nor dims to draw: its one value and where it lives.
  const what = ndim === 0
    ? `one value${info.replicas > 1 ? `, replicated ×${info.replicas}` : ""}`
    : `${info.num_blocks} distinct shard${info.num_blocks === 1 ? "" : "s"} of shape `
      + `[${info.shard_shape.join(", ")}]${rep}`;
  root.append(h("div", { class: "jxs-muted" }, [`${what} · ${held}`]));
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
  const [W, H] = plotSize(R, C, rd === null ? null : shape[rd] || 1,
    cd === null ? 1 : shape[cd] || 1, widthOf(root) - 60);
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

/** @type {import("./shared.js").ViewSpec} */
const VIEW = { kind: "sharding", draw: renderSharding, traits: ["info", "dims", "selected_process"] };

export default {
  /** @param {{model: AnyModel, el: HTMLElement}} ctx */
  render: (ctx) => mount(ctx, VIEW),
};
