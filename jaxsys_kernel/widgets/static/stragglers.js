// @ts-check
// StragglersView: per step, whose arrival the others waited for and by how much, and each
// listed process's time per step as a stacked bar; at many processes, the ten that waited
// least and a histogram of every process's mean wait.
// Python inlines shared.js in place of the import below (see shared.js for why).
import { h, mount } from "./shared.js";

/** @typedef {import("./shared.js").AnyModel} AnyModel */

// The same colours as widgets/stragglers.py and %jaxsys where's picture.
const COLOURS = /** @type {Record<string, string>} */ ({
  input: "#9467bd",
  host: "#ff7f0e",
  compile: "#d62728",
  compute: "#1f77b4",
  wait: "#c7c7c7",
});

/** @param {number} s */
const ms = (s) => `${(s * 1e3).toFixed(1)} ms`;

/** @param {any} info */
function verdictText(info) {
  if (!info.steps_total) return "no step spanning processes recorded yet";
  const named = info.named;
  const head = named ? `p${named.rank} held the others up, in ${named.category}`
    : "no process held the others up beyond the noise";
  return `${head} (${info.steps_total} steps, ${info.processes} processes)`;
}

/** The latest steps: who arrived last, how late, in what. @param {any[]} steps */
function stepsTable(steps) {
  const head = h("tr", {}, ["step", "arrived last", "late by", "in"].map((t) => h("th", {}, [t])));
  const rows = steps.map((s) => h("tr", {
    class: "jxs-step" + (s.named ? " jxs-step-named" : ""),
    "data-last": String(s.last),
    "data-category": s.named ? s.category : "",
    style: s.named ? { fontWeight: "600" } : {},
  }, [
    h("td", {}, [String(s.step)]),
    h("td", { class: "jxs-step-last" }, [`p${s.last}`]),
    h("td", {}, [s.named ? ms(s.late) : `${ms(s.late)} (noise)`]),
    h("td", { class: "jxs-step-category" }, [s.named ? s.category : "—"]),
  ]));
  return h("table", { class: "jxs-table jxs-steps" }, [head, ...rows]);
}

/** One stacked bar per listed process. @param {any[]} rows @param {string[]} parts */
function bars(rows, parts) {
  const total = Math.max(...rows.map((r) => parts.reduce((a, p) => a + (r[p] || 0), 0)), 1e-9);
  const legend = h("div", { class: "jxs-legend" }, parts.map((p) =>
    h("span", { class: "jxs-chip" }, [h("i", { style: { background: COLOURS[p] || "#888" } }), p])));
  const lines = rows.map((r) => {
    const sum = parts.reduce((a, p) => a + (r[p] || 0), 0);
    const segs = parts.filter((p) => r[p] > 0).map((p) => h("span", {
      class: `jxs-seg jxs-seg-${p}`,
      title: `p${r.rank} ${p} ${ms(r[p])}`,
      style: { display: "inline-block", height: "12px", background: COLOURS[p] || "#888",
        width: `${(100 * r[p]) / total}%` },
    }));
    return h("div", { class: "jxs-strag-row", "data-rank": String(r.rank),
      title: `p${r.rank}: ` + parts.map((p) => `${p} ${ms(r[p] || 0)}`).join(", "),
      style: { display: "flex", alignItems: "center", gap: "6px", margin: "1px 0" } }, [
      h("span", { class: "jxs-strag-name", style: { width: "48px", flex: "none" } }, [`p${r.rank}`]),
      h("span", { class: "jxs-strag-bar", style: { flex: "1", display: "flex", minWidth: "0" } }, segs),
      h("span", { class: "jxs-muted", style: { width: "80px", flex: "none", textAlign: "right" } },
        [ms(sum)]),
    ]);
  });
  return h("div", { class: "jxs-strag-bars" }, [
    h("div", { class: "jxs-muted" }, ["mean time per step"]), legend, ...lines]);
}

/** Every process's mean wait, in bins. @param {any} hist @param {number} n */
function histogram(hist, n) {
  const most = Math.max(...hist.counts, 1);
  return h("div", { class: "jxs-strag-hist" }, [
    h("div", { class: "jxs-muted" }, [`mean wait inside collectives, all ${n} processes`]),
    ...hist.counts.map((/** @type {number} */ c, /** @type {number} */ i) => {
      const lo = hist.lo + i * hist.width;
      return h("div", { class: "jxs-hist-bin", style: { display: "flex", gap: "6px" } }, [
        h("span", { style: { width: "150px", flex: "none" } }, [`${ms(lo)} – ${ms(lo + hist.width)}`]),
        h("span", { style: { display: "inline-block", height: "10px", marginTop: "3px",
          background: COLOURS.wait, width: `${(60 * c) / most}%` } }),
        h("span", {}, [String(c)]),
      ]);
    }),
  ]);
}

/** @param {AnyModel} model @param {HTMLElement} root */
function renderStragglers(model, root) {
  const info = model.get("info") || {};
  const recording = Boolean(model.get("recording"));
  root.append(h("div", { class: "jxs-title" }, [
    h("b", {}, ["Stragglers"]), " · ",
    h("span", { class: "jxs-verdict" }, [verdictText(info)]),
  ]));
  const note = model.get("note") || "";
  if (!info.steps_total) {
    root.append(h("div", { class: "jxs-empty" }, [recording
      ? "Recording: run a cell whose jitted calls span processes."
      : "Step arrivals are not recorded: run %jaxsys where on, then a cell."]));
    if (note) root.append(h("div", { class: "jxs-muted jxs-strag-note" }, [note]));
    return;
  }
  root.append(stepsTable(info.steps || []));
  if ((info.rows || []).length) root.append(bars(info.rows, info.parts || Object.keys(COLOURS)));
  if (info.histogram) root.append(histogram(info.histogram, info.processes));
  for (const [r, why] of Object.entries(info.refused || {})) {
    root.append(h("div", { class: "jxs-note" }, [`p${r}'s records were refused: ${why}`]));
  }
  if (info.more_refused) {
    root.append(h("div", { class: "jxs-note" }, [`${info.more_refused} more processes' records were refused`]));
  }
  const late = (info.steps || []).filter((/** @type {any} */ s) => s.named).length;
  root.append(h("div", { class: "jxs-muted jxs-strag-note" }, [
    `${late} of the last ${(info.steps || []).length} steps beyond the noise`
    + (recording ? "" : " · recording is off") + (note ? ` · ${note}` : ""),
  ]));
}

/** @type {import("./shared.js").ViewSpec} */
const VIEW = { kind: "stragglers", draw: renderStragglers, traits: ["info", "recording", "note"] };

export default {
  /** @param {{model: AnyModel, el: HTMLElement}} ctx */
  render: (ctx) => mount(ctx, VIEW),
};
