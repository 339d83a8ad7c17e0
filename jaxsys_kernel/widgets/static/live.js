// @ts-check
// LiveDevicesView: which processes and devices are alive, heartbeat ages, controls and
// the event log.
// Python inlines shared.js in place of the import below (see shared.js for why).
import { formatRanges, formatSeconds, groupButtons, h, keepInStep, mount } from "./shared.js";

/** @typedef {import("./shared.js").AnyModel} AnyModel */

const STATE_COLOURS = {
  alive: "#5cb85c",
  stuck: "#f0ad4e",
  dead: "#d9534f",
  restarting: "#5bc0de",
  unknown: "#b0b0b0",
};
const MAX_LOG_LINES = 200;

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

/** @param {Record<string, number>} counts */
const countsText = (counts) => Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(", ");

/** Above the group size: the summary's groups and shared errors.
 * @param {AnyModel} model @param {any} summary */
function groupsOf(model, summary) {
  const colour = (/** @type {any} */ g) =>
    STATE_COLOURS[/** @type {keyof STATE_COLOURS} */ (g.worst)] || STATE_COLOURS.unknown;
  const late = (/** @type {any} */ g) => (g.oldest_heartbeat ? ` · ♥ ${g.oldest_heartbeat} s` : "");
  return h("div", {}, [
    groupButtons(model, summary.groups, (g) => countsText(g.states) + late(g), colour),
    ...(summary.errors || []).map((/** @type {any} */ e) =>
      h("div", { class: "jxs-note jxs-live-error" }, [e.ranks ? `p${e.ranks}: ${e.error}` : e.error])),
  ]);
}

/** @param {AnyModel} model @param {HTMLElement} root */
function renderLive(model, root) {
  /** @type {any[]} */
  const live = model.get("liveness") || [];
  /** @type {string[]} */
  const log = model.get("event_log") || [];
  const summary = model.get("summary") || {};
  const large = Boolean(summary.groups?.length);
  const counts = /** @type {Record<string, number>} */ ({});
  for (const p of live) counts[p.state || "unknown"] = (counts[p.state || "unknown"] || 0) + 1;
  const total = large ? Object.values(summary.by_state).reduce((a, b) => a + b, 0) : live.length;
  root.append(h("div", { class: "jxs-title" }, [
    h("b", {}, ["Processes"]),
    large ? ` · ${total} in ${summary.groups.length} groups of ${summary.group_size} · ${countsText(summary.by_state)}`
      : live.length ? ` · ${countsText(counts)}` : "",
  ]));
  root.append(h("div", { class: "jxs-legend" }, Object.entries(STATE_COLOURS).map(([k, c]) =>
    h("span", { class: "jxs-chip" }, [h("i", { style: { background: c } }), k]))));
  if (!live.length && !large) {
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
      control("stop cell", "interrupt the running cell on every process", "interrupt", null),
      control("dump stacks", "Python stacks of every process", "stacks", null),
      // "restart" without a process restarts the whole world (the kernel's command registry).
      control("restart world", "replace every process and re-initialise JAX", "restart", null),
      h("span", { class: "jxs-muted jxs-control-status" }, [model.get("control_status") || ""]),
    ]));
  }
  if (large) root.append(groupsOf(model, summary));
  const compact = live.length > 64;
  const grid = h("div", { class: compact ? "jxs-live jxs-live-compact" : "jxs-live" });
  for (const p of live) {
    const state = p.state || "unknown";
    const colour = STATE_COLOURS[/** @type {keyof STATE_COLOURS} */ (state)] || STATE_COLOURS.unknown;
    const age = p.heartbeat_age;
    const tip = `process ${p.rank} · ${state} · heartbeat ${formatSeconds(age)} ago`
      + ` · incarnation ${p.incarnation ?? 0}`
      + (p.restarts ? ` · restarted alone ${p.restarts}× since the cluster started` : "")
      + (p.busy ? " · busy" : "")
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
      h("span", { class: "jxs-muted" }, [`inc ${p.incarnation ?? 0}${p.restarts ? ` · restarted ${p.restarts}×` : ""}`
        + (p.busy ? " · busy" : "")]),
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

/** @type {import("./shared.js").ViewSpec} */
const VIEW = { kind: "live", draw: renderLive, traits: ["liveness", "event_log", "controls", "control_status", "telemetry_health",
  "summary", "open_group", "rows_version"] };

export default {
  initialize: keepInStep,
  /** @param {{model: AnyModel, el: HTMLElement}} ctx */
  render: (ctx) => mount(ctx, VIEW),
};
