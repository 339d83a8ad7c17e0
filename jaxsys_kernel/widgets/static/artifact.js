// @ts-check
// Front end of ArtifactView: the card of an exported JAX computation.
//
// Everything drawn comes from the `info` trait (an "export" summary computed on an engine), so a
// saved notebook redraws without a kernel. The Python side also puts the same facts in the
// output as HTML and text; this module only makes them easier to read: types with their
// symbols highlighted, constraints as chips, and a verdict on whether the artifact loads here.

/**
 * @typedef {object} AnyModel
 * @property {(name: string) => any} get
 * @property {(event: string, cb: () => void) => void} on
 * @property {(event: string, cb?: () => void) => void} off
 */

// ---- from shared.js: h
// (written by jaxsys_kernel.widgets.esm.write_copies(): edit shared.js, not here)
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
// ---- end of shared.js

/** @param {number} n */
export function formatSize(n) {
  if (n < 10000) return `${n.toLocaleString("en")} bytes`;
  return `${(n / 1024).toFixed(1)} KiB`;
}

/**
 * A type such as "f32[4*b, 4]" with its symbols marked.
 * @param {string} type
 * @param {string[]} symbols
 */
function typeNode(type, symbols) {
  const code = h("code", { class: "jxs-art-type" });
  if (!symbols.length) {
    code.append(type);
    return code;
  }
  const pattern = new RegExp(`\\b(${symbols.map((s) => s.replace(/\W/g, "\\$&")).join("|")})\\b`);
  for (const part of type.split(pattern)) {
    code.append(symbols.includes(part) ? h("span", { class: "jxs-art-sym" }, [part]) : part);
  }
  return code;
}

/**
 * @param {string} title
 * @param {any[]} args
 * @param {string[]} symbols
 */
function argTable(title, args, symbols) {
  const rows = (args || []).map((a) => h("tr", {}, [
    h("td", { class: "jxs-art-name" }, [a.name]),
    h("td", {}, [typeNode(a.type, symbols)]),
    h("td", { class: "jxs-art-muted" }, [a.sharding || "unspecified sharding"]),
  ]));
  if (!rows.length) rows.push(h("tr", {}, [h("td", { class: "jxs-art-muted" }, ["none"])]));
  return h("div", { class: "jxs-art-block" }, [
    h("div", { class: "jxs-art-label" }, [title]),
    h("table", { class: "jxs-art-args" }, [h("tbody", {}, rows)]),
  ]);
}

/**
 * @param {string} label
 * @param {string | Node} value
 */
function fact(label, value) {
  return h("div", { class: "jxs-art-fact" }, [
    h("span", { class: "jxs-art-label" }, [label]),
    typeof value === "string" ? h("span", {}, [value]) : value,
  ]);
}

/** @param {any} info @param {HTMLElement} root */
export function renderCard(info, root) {
  if (!info || !info.fun_name) {
    root.append(h("div", { class: "jxs-art-muted" }, ["No exported computation."]));
    return;
  }
  const symbols = info.symbols || [];
  const [lo, hi] = info.accepted || [null, null];
  const ok = Boolean(info.loads_here) && Boolean(info.runs_here);
  root.append(h("div", { class: "jxs-art-head" }, [
    h("b", {}, [`Exported ${info.fun_name}`]),
    h("span", { class: `jxs-art-badge ${ok ? "jxs-art-ok" : "jxs-art-warn"}` }, [
      info.loads_here ? (info.runs_here ? "loads and runs here" : "loads here, cannot run here")
        : "does not load here",
    ]),
  ]));
  root.append(argTable("inputs", info.inputs, symbols));
  root.append(argTable("outputs", info.outputs, symbols));
  const chips = h("span", {}, (info.constraints || []).map((c) =>
    h("code", { class: "jxs-art-chip" }, [c])));
  if (!(info.constraints || []).length) chips.append("none");
  root.append(fact("symbols", symbols.length ? symbols.join(", ") : "none (static shapes)"));
  root.append(fact("constraints", chips));
  root.append(fact("devices", `${info.nr_devices}${info.mesh ? ` (mesh ${info.mesh})` : ""}; `
    + `this world has ${info.devices_here ?? "?"}`));
  root.append(fact("platforms", `${(info.platforms || []).join(", ")} `
    + `(this process: ${info.platform_here ?? "?"})`));
  root.append(fact("calling convention", `${info.calling_convention}; this jaxlib `
    + `(${info.jaxlib ?? "?"}) accepts ${lo} to ${hi}`));
  if (info.why_not) root.append(fact("why not", info.why_not));
  root.append(fact("serialized", formatSize(info.serialized_bytes ?? 0)));
  root.append(fact("checks off", (info.disabled_checks || []).join(", ") || "none"));
  root.append(fact("effects", (info.effects || []).join(", ") || "none"));
  root.append(fact("derivatives", info.has_vjp ? "reverse-mode available" : "none"));
  if (info.path) root.append(fact("file", info.path));
}

export default {
  /** @param {{model: AnyModel, el: HTMLElement}} ctx */
  render({ model, el }) {
    const root = h("div", { class: "jxs-artifact" });
    el.append(root);
    const draw = () => {
      root.replaceChildren();
      try {
        renderCard(model.get("info"), root);
      } catch (err) {
        root.replaceChildren(h("pre", {}, [`jaxsys card failed: ${err}`]));
      }
    };
    draw();
    model.on("change:info", draw);
    return () => {
      model.off("change:info", draw);
      root.remove();
    };
  },
};
