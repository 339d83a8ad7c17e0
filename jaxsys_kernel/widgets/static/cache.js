// @ts-check
// CacheView: compilation-cache statistics, one row per process plus a total.
// Python inlines shared.js in place of the import below (see shared.js for why).
import { formatBytes, formatRanges, formatSeconds, groupButtons, h, keepInStep, mount } from "./shared.js";

/** @typedef {import("./shared.js").AnyModel} AnyModel */

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
  const groups = model.get("summary")?.groups || [];
  root.append(h("div", { class: "jxs-title" }, [h("b", {}, ["Compilation cache"])]));
  if (groups.length) {
    // Above the group size: a row per group of ranks; a click shows the group's processes.
    /** @param {string} k */
    const sum = (k) => groups.reduce((/** @type {number} */ a, /** @type {any} */ g) => a + (g[k] ?? 0), 0);
    const req = sum("requests");
    root.append(h("div", { class: "jxs-muted" }, [
      `all: ${sum("hits")} hits of ${req} requests (${req ? Math.round((100 * sum("hits")) / req) : 0}%)`
      + ` · ${sum("compiles")} compiles · ${formatSeconds(sum("compile_time"))} compiling`
      + ` · ${formatSeconds(sum("time_saved"))} saved`,
    ]));
    root.append(groupButtons(model, groups, (g) => `${g.hits}/${g.requests} hits · `
      + `${g.compiles} compiles · ${formatSeconds(g.time_saved)} saved · ${formatBytes(g.bytes)}`));
  }
  if (!stats.length && groups.length) return;
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

/** @type {import("./shared.js").ViewSpec} */
const VIEW = { kind: "cache", draw: renderCache, traits: ["stats", "summary", "open_group", "rows_version"] };

export default {
  initialize: keepInStep,
  /** @param {{model: AnyModel, el: HTMLElement}} ctx */
  render: (ctx) => mount(ctx, VIEW),
};
