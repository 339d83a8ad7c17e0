// @ts-check
// MeshView: a device mesh as a grid of cells coloured by process; leading axes of a
// 3-D or 4-D mesh become small multiples, and large meshes go on a canvas.
// Python inlines shared.js in place of the import below (see shared.js for why).
import { canvasOf, h, mount, processColour, processLegend, widthOf } from "./shared.js";

/** @typedef {import("./shared.js").AnyModel} AnyModel */

const SLICE_EDGES = ["#1f4e79", "#7a3b00", "#1e5e1e", "#7a1f1f", "#4b2d74", "#5c4033"];
// Below this many pixels per cell, text labels give way to a canvas.
const LABEL_CELL_PX = 40;

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

/** @type {import("./shared.js").ViewSpec} */
const VIEW = { kind: "mesh", draw: renderMesh, traits: ["info"] };

export default {
  /** @param {{model: AnyModel, el: HTMLElement}} ctx */
  render: (ctx) => mount(ctx, VIEW),
};
