// opgate dashboard: filterable matrix + per-cell evidence. Data comes from the
// JSON block #opgate-data; every string reaches the DOM through textContent.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("opgate-data").textContent);
  const ICON = { pass: "✓", fallback: "⚠", fail: "✗", untested: "–", unsupported: "⊘" };
  const SEVERITY = ["error", "fail", "flaky", "fallback", "unsupported", "pass", "skip"];
  const FILTERS = [
    ["op", "op / impl", (c) => c.row],
    ["column", "environment", (c) => c.column],
    ["dtype", "dtype", (c) => c.axes.dtype],
    ["layout", "layout", (c) => c.axes.layout],
    ["mode", "mode", (c) => c.axes.mode],
    ["verdict", "verdict", (c) => c.verdict],
  ];
  const columnOrder = DATA.columns.map((c) => c.name);
  const columnLabel = Object.fromEntries(DATA.columns.map((c) => [c.name, c.label]));
  const modeOrder = ["eager", "compile", "cudagraphs", "export", "aoti", "build"];

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function uniq(values) {
    return Array.from(new Set(values)).sort();
  }
  function worst(cells) {
    return cells.slice().sort((a, b) => SEVERITY.indexOf(a.verdict) - SEVERITY.indexOf(b.verdict))[0];
  }

  function buildFilters() {
    const form = document.getElementById("filters");
    for (const [key, label, get] of FILTERS) {
      const wrap = el("label", {}, label + " ");
      const select = el("select", { id: "f-" + key, name: key });
      select.appendChild(el("option", { value: "" }, "all"));
      let values = uniq(DATA.cells.map(get));
      if (key === "column") values = columnOrder.filter((c) => values.includes(c));
      for (const v of values) select.appendChild(el("option", { value: v }, key === "column" ? columnLabel[v] : v));
      select.addEventListener("change", render);
      wrap.appendChild(select);
      form.appendChild(wrap);
    }
    const reset = el("button", { type: "button", id: "f-reset" }, "reset");
    reset.addEventListener("click", () => {
      for (const [key] of FILTERS) document.getElementById("f-" + key).value = "";
      render();
    });
    form.appendChild(reset);
  }

  function selected() {
    const out = {};
    for (const [key, , get] of FILTERS) out[key] = [document.getElementById("f-" + key).value, get];
    return out;
  }

  function render() {
    const filters = selected();
    const cells = DATA.cells.filter((c) =>
      Object.values(filters).every(([value, get]) => value === "" || get(c) === value));
    const colKeys = [];
    const rows = new Map();
    for (const c of cells) {
      const colKey = c.column + "\u0000" + c.axes.mode;
      if (!colKeys.includes(colKey)) colKeys.push(colKey);
      const rowKey = [c.row, c.axes.dtype, c.axes.layout, c.axes.shapes].join("\u0000");
      if (!rows.has(rowKey)) rows.set(rowKey, new Map());
      const slots = rows.get(rowKey);
      if (!slots.has(colKey)) slots.set(colKey, []);
      slots.get(colKey).push(c);
    }
    colKeys.sort((a, b) => {
      const [ca, ma] = a.split("\u0000");
      const [cb, mb] = b.split("\u0000");
      return columnOrder.indexOf(ca) - columnOrder.indexOf(cb) || modeOrder.indexOf(ma) - modeOrder.indexOf(mb);
    });
    const table = document.getElementById("matrix");
    table.replaceChildren();
    const thead = el("thead");
    const top = el("tr");
    const sub = el("tr");
    top.appendChild(el("th", { rowspan: "2" }, "op / impl · dtype · layout"));
    let i = 0;
    while (i < colKeys.length) {
      const col = colKeys[i].split("\u0000")[0];
      let span = 0;
      while (i + span < colKeys.length && colKeys[i + span].split("\u0000")[0] === col) span += 1;
      top.appendChild(el("th", { colspan: String(span), class: "col" }, columnLabel[col] || col));
      for (let k = 0; k < span; k += 1) sub.appendChild(el("th", { class: "mode" }, colKeys[i + k].split("\u0000")[1]));
      i += span;
    }
    thead.append(top, sub);
    const tbody = el("tbody");
    let shown = 0;
    for (const rowKey of Array.from(rows.keys()).sort()) {
      const [row, dtype, layout, shapes] = rowKey.split("\u0000");
      const tr = el("tr");
      const name = [row, dtype, layout].concat(shapes === "default" ? [] : [shapes]).join(" · ");
      tr.appendChild(el("th", { class: "rowname" }, name));
      for (const colKey of colKeys) {
        const td = el("td");
        const group = rows.get(rowKey).get(colKey);
        if (group) {
          const top = worst(group);
          const button = el("button", {
            type: "button",
            class: "slot b-" + top.bucket,
            "data-cell": top.id,
            "data-verdict": top.verdict,
            title: top.id + ": " + group.map((c) => c.verdict).join(", "),
          }, ICON[top.bucket]);
          button.addEventListener("click", () => showDetails(group));
          td.appendChild(button);
          shown += 1;
        }
        tr.appendChild(td);
      }
      tbody.appendChild(tr);
    }
    table.append(thead, tbody);
    const count = document.getElementById("count");
    count.textContent = shown + " cell(s) shown, " + cells.length + " verdict(s) of " + DATA.cells.length;
    count.setAttribute("data-visible", String(shown));
  }

  function section(parent, title) {
    const box = el("section", { class: "evidence" });
    box.appendChild(el("h4", {}, title));
    parent.appendChild(box);
    return box;
  }

  function showDetails(group) {
    const panel = document.getElementById("details");
    panel.replaceChildren();
    const close = el("button", { type: "button", class: "close", "aria-label": "close" }, "×");
    close.addEventListener("click", () => { panel.hidden = true; });
    panel.appendChild(close);
    panel.appendChild(el("h3", { id: "details-id" }, group[0].id));
    for (const c of group) {
      const env = DATA.environments[c.env_key] || { gpu: "", fingerprint: {} };
      const head = el("p", { class: "verdict b-" + c.bucket });
      head.textContent = ICON[c.bucket] + " " + c.verdict + " · " + c.env_key + (env.gpu ? " · " + env.gpu : "");
      panel.appendChild(head);
      if (c.reason) panel.appendChild(el("p", { class: "reason" }, c.reason));
      const repro = section(panel, "Re-run this cell");
      repro.appendChild(el("pre", { class: "repro" }, c.repro || "(no command recorded)"));
      const kernels = section(panel, "Kernels / op events seen");
      if (c.kernels.length) {
        const ul = el("ul", { class: "kernels" });
        for (const k of c.kernels) ul.appendChild(el("li", {}, k));
        kernels.appendChild(ul);
      } else {
        kernels.appendChild(el("p", { class: "muted" }, "none recorded"));
      }
      const checks = section(panel, "Checks");
      const table = el("table", { class: "checks" });
      const hr = el("tr");
      for (const h of ["check", "status", "summary", "details", "s"]) hr.appendChild(el("th", {}, h));
      table.appendChild(hr);
      for (const check of c.checks) {
        const tr = el("tr", { class: "s-" + check.status });
        tr.appendChild(el("td", {}, check.name));
        tr.appendChild(el("td", {}, check.status));
        tr.appendChild(el("td", {}, check.summary || ""));
        const details = el("td");
        if (check.details && Object.keys(check.details).length) {
          details.appendChild(el("pre", {}, JSON.stringify(check.details, null, 1)));
        }
        tr.appendChild(details);
        tr.appendChild(el("td", {}, (check.duration_s || 0).toFixed(2)));
        table.appendChild(tr);
      }
      checks.appendChild(table);
      const errors = c.checks.filter((k) => ["error", "fail"].includes(k.status));
      if (errors.length) {
        const box = section(panel, "Errors");
        for (const k of errors) {
          const text = (k.details && (k.details.error || k.details.traceback)) || k.summary || k.status;
          box.appendChild(el("pre", { class: "error" }, String(text).startsWith(k.name) ? text : k.name + ": " + text));
        }
      }
      const meta = section(panel, "Run");
      meta.appendChild(el("p", { class: "muted" },
        "seed " + c.seed + " · attempts " + c.attempts + " · " + c.duration_s + " s"));
      meta.appendChild(el("pre", { class: "fingerprint" }, JSON.stringify(env.fingerprint, null, 1)));
    }
    panel.hidden = false;
    panel.scrollIntoView({ block: "nearest" });
  }

  buildFilters();
  render();
})();
