// @ts-check
// What every jaxsys view shares: process colours, a DOM builder, number formats, the process
// legend, the canvas used for large layouts, and `mount`, which draws a view from its traits
// and redraws it when they change.
//
// Each view is its own ES module (mesh.js, sharding.js, cache.js, live.js) that imports
// from this one. There is no build step: when Python loads a view, it replaces the view's one
// `import ... from "./shared.js"` line by this file's text (see `esm.py`), so every widget's
// `_esm` is a single self-contained module. anywidget loads `_esm` from a blob or data URL,
// which has no base URL to resolve "./shared.js" against, and the same widget state must
// load in JupyterLab, Notebook 7 and an nbconvert page alike; a self-contained module needs
// neither a server route nor a content-security policy that allows nested data: imports.

/**
 * @typedef {object} AnyModel
 * @property {(name: string) => any} get
 * @property {(name: string, value: any) => void} set
 * @property {() => void} save_changes
 * @property {(event: string, cb: (...args: any[]) => void) => void} on
 * @property {(event: string, cb?: (...args: any[]) => void) => void} off
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
export const PALETTE = [
  "#8ec5ea", "#f7b26b", "#93d193", "#f19a9a", "#c3a8e0",
  "#d2ad9f", "#f2b6dd", "#c4c4c4", "#dede87", "#8fdbe5",
];
// Below this many pixels per cell, neighbouring cells are merged before drawing.
export const MIN_CELL_PX = 3;
const MAX_LEGEND = 64;

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

/** @param {number | null | undefined} s */
export function formatSeconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  return `${(s / 60).toFixed(1)} min`;
}

/** @param {HTMLElement} root */
export function widthOf(root) {
  const w = root.clientWidth || root.parentElement?.clientWidth || 0;
  return Math.max(240, Math.min(w || 720, 1100));
}

/**
 * Legend of processes; clicking one calls onPick (when given).
 * @param {number[]} processes
 * @param {number | null} selected
 * @param {((p: number) => void) | null} onPick
 */
export function processLegend(processes, selected, onPick) {
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
export function canvasOf(width, height, rects) {
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

// ------------------------------------------------------------------- deltas and groups

/**
 * Keep a model's rows in step with the kernel's deltas for as long as the model lives,
 * shown or not: the kernel sends deltas from the moment the view exists, and a view
 * displayed later must not start from rows that missed them. The kernel is asked once for
 * the rows whole, for deltas sent before this module had loaded.
 * Use it as a view module's anywidget `initialize`.
 * @param {{model: AnyModel & {send: (m: any) => void}}} ctx
 * @returns {() => void}
 */
export function keepInStep({ model }) {
  const onMsg = (/** @type {any} */ msg) => applyMessage(model, msg);
  model.on("msg:custom", onMsg);
  model.send({ type: "resync" });
  return () => model.off("msg:custom", onMsg);
}

/**
 * Apply a delta the kernel sent (`rowsync.py`) to the model's copy of a trait, without
 * sending it back: the copy stays current, and a saved notebook keeps it.
 * `{type: "rows", trait, v, base, rows, gone, ages, log?}` changes rows keyed by rank (a
 * copy of another version asks for the rows whole); `{type: "log", append, keep}` (or a
 * rows message's `log`) appends lines to the event log.
 * @param {AnyModel & {send: (m: any) => void}} model
 * @param {any} msg
 */
export function applyMessage(model, msg) {
  const log = msg?.type === "log" ? msg : msg?.log;
  if (log) {
    const lines = [...(model.get("event_log") || []), ...(log.append || [])];
    model.set("event_log", lines.slice(-(log.keep || lines.length)));
  }
  if (msg?.type !== "rows") return;
  if ((model.get("rows_version") ?? 0) !== msg.base) {
    model.send({ type: "resync" });
    return;
  }
  /** @type {Map<number, any>} */
  const byRank = new Map((model.get(msg.trait) || []).map((/** @type {any} */ r) => [r.rank, r]));
  for (const r of msg.gone || []) byRank.delete(r);
  for (const [k, row] of Object.entries(msg.rows || {})) {
    byRank.set(Number(k), { ...(byRank.get(Number(k)) || {}), ...row });
  }
  for (const [k, age] of Object.entries(msg.ages || {})) {
    const p = byRank.get(Number(k));
    if (p) byRank.set(p.rank, { ...p, heartbeat_age: age });
  }
  model.set("rows_version", msg.v);
  model.set(msg.trait, [...byRank.values()].sort((a, b) => a.rank - b.rank));
}

/**
 * Above the group size: one button per group of ranks (a click opens it: the kernel then
 * sends its rows), and a way back while one is open.
 * @param {AnyModel} model
 * @param {any[]} groups   the summary's groups ({group, ranks, ...})
 * @param {(g: any) => string} text   what a group's button says after its ranks
 * @param {(g: any) => string} [colour]
 */
export function groupButtons(model, groups, text, colour) {
  const open = model.get("open_group");
  /** @param {number|null} g */
  const pick = (g) => {
    model.set("open_group", g);
    model.save_changes();
  };
  const shown = groups.find((g) => g.group === open);
  return h("div", { class: "jxs-groups" }, [
    shown ? h("button", { class: "jxs-button jxs-groups-back", onclick: () => pick(null) },
      [`← all groups (showing p${shown.ranks})`]) : null,
    h("div", { class: "jxs-group-list" }, groups.map((g) => h("button", {
      class: "jxs-group" + (g.group === open ? " jxs-group-open" : ""),
      "data-group": String(g.group),
      title: `processes ${g.ranks}: click for their rows`,
      // Inline: the group list is the one part of views.css's tables they would not fit.
      style: {
        display: "block", textAlign: "left", margin: "1px 0", padding: "1px 6px",
        font: "inherit", cursor: "pointer", background: g.group === open ? "#eee" : "transparent",
        border: "1px solid #ddd", borderLeft: `4px solid ${colour ? colour(g) : "#bbb"}`,
      },
      onclick: () => pick(g.group),
    }, [`p${g.ranks}: ${text(g)}`]))),
  ]);
}

// ---------------------------------------------------------------------------------- mount

/**
 * A view's drawing, its traits and its kind (the root element's class is `jxs-<kind>`).
 * @typedef {object} ViewSpec
 * @property {string} kind
 * @property {(m: AnyModel, r: HTMLElement) => void} draw
 * @property {string[]} traits
 */

/**
 * Draw a view into `el` and redraw it when its traits change or its width does.
 * @param {{model: AnyModel, el: HTMLElement}} ctx
 * @param {ViewSpec} view
 * @returns {() => void} the clean-up anywidget calls when the view is removed
 */
export function mount({ model, el }, view) {
  const root = h("div", { class: `jxs-root jxs-${view.kind}` });
  el.append(root);
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
  // Deltas change the traits above (see keepInStep), which redraws.
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
}
