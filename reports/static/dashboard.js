// opgate dashboard: loads compat.json from beside the page, then a filterable
// matrix, per-cell evidence and a link of its own for every cell (#cell=<id>).
// Labels and orders come from the inline layout block (#opgate-layout).
"use strict";
(function () {
  const LAYOUT = JSON.parse(document.getElementById("opgate-layout").textContent);
  const { el } = OpgateEvidence;
  const FILTERS = [
    ["op", "op / impl", (c) => c.row],
    ["column", "environment", (c) => c.column],
    ["dtype", "dtype", (c) => c.axes.dtype],
    ["layout", "layout", (c) => c.axes.layout],
    ["mode", "mode", (c) => c.axes.mode],
    ["verdict", "verdict", (c) => c.verdict],
  ];
  const columnOrder = LAYOUT.columns.map((c) => c.name);
  const columnLabel = Object.fromEntries(LAYOUT.columns.map((c) => [c.name, c.label]));
  const state = { cells: [], environments: {}, byId: new Map(), modes: [], modeSummary: {} };

  function uniq(values) {
    return Array.from(new Set(values)).sort();
  }
  function worst(cells) {
    const rank = (c) => LAYOUT.severity.indexOf(c.verdict);
    return cells.slice().sort((a, b) => rank(a) - rank(b))[0];
  }
  function status(stateName, text) {
    const box = document.getElementById("load-status");
    box.dataset.state = stateName;
    box.replaceChildren();
    if (text) box.appendChild(el("p", {}, text));
    box.hidden = stateName === "loaded" && !text;
    return box;
  }

  // ---- the cell link: index.html#cell=<id> ---------------------------------------------------
  function anchorOf(id) {
    return "#" + LAYOUT.anchor + encodeURIComponent(id);
  }
  function cellFromHash() {
    const hash = decodeURIComponent(location.hash.slice(1));
    return hash.startsWith(LAYOUT.anchor) ? hash.slice(LAYOUT.anchor.length) : null;
  }
  function markTarget(slot) {
    for (const old of document.querySelectorAll(".slot.target")) old.classList.remove("target");
    if (slot) slot.classList.add("target");
  }
  function openFromHash() {
    const id = cellFromHash();
    if (!state.cells.length) return;
    if (id === null) {
      document.getElementById("details").hidden = true;
      markTarget(null);
      return;
    }
    const group = state.byId.get(id);
    if (!group) {
      status("loaded", "No cell " + id + " in this matrix (" + LAYOUT.generated_at + ").");
      return;
    }
    let slot = document.querySelector('.slot[data-cell="' + CSS.escape(id) + '"]');
    if (!slot) { // hidden by a filter: show everything, then the cell
      for (const [key] of FILTERS) document.getElementById("f-" + key).value = "";
      render();
      slot = document.querySelector('.slot[data-cell="' + CSS.escape(id) + '"]');
    }
    markTarget(slot);
    if (slot) slot.scrollIntoView({ block: "center", inline: "center" });
    showDetails(group);
  }

  // ---- filters and the matrix ----------------------------------------------------------------
  function buildFilters() {
    const form = document.getElementById("filters");
    form.replaceChildren();
    for (const [key, label, get] of FILTERS) {
      const wrap = el("label", {}, label + " ");
      const select = el("select", { id: "f-" + key, name: key });
      select.appendChild(el("option", { value: "" }, "all"));
      let values = uniq(state.cells.map(get));
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

  function render() {
    const filters = FILTERS.map(([key, , get]) => [document.getElementById("f-" + key).value, get]);
    const cells = state.cells.filter((c) => filters.every(([value, get]) => value === "" || get(c) === value));
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
      return columnOrder.indexOf(ca) - columnOrder.indexOf(cb) || state.modes.indexOf(ma) - state.modes.indexOf(mb);
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
      for (let k = 0; k < span; k += 1) {
        const mode = colKeys[i + k].split("\u0000")[1];
        sub.appendChild(el("th", { class: "mode", title: state.modeSummary[mode] || "" }, mode));
      }
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
          const head = worst(group);
          const link = el("a", {
            href: anchorOf(head.id),
            class: "slot b-" + head.bucket,
            "data-cell": head.id,
            "data-verdict": head.verdict,
            title: head.id + ": " + group.map((c) => c.verdict).join(", ") + (head.reason ? " · " + head.reason : ""),
          }, LAYOUT.glyphs[head.bucket]);
          link.addEventListener("click", (event) => {
            event.preventDefault(); // a click opens the cell where it is; a followed link scrolls to it
            history.pushState(null, "", anchorOf(head.id));
            markTarget(link);
            showDetails(state.byId.get(head.id));
          });
          td.appendChild(link);
          shown += 1;
        }
        tr.appendChild(td);
      }
      tbody.appendChild(tr);
    }
    table.append(thead, tbody);
    const count = document.getElementById("count");
    count.textContent = shown + " cell(s) shown, " + cells.length + " verdict(s) of " + state.cells.length;
    count.setAttribute("data-visible", String(shown));
  }

  // ---- one cell's evidence -------------------------------------------------------------------
  function section(parent, title) {
    const box = el("section", { class: "evidence" });
    box.appendChild(el("h4", {}, title));
    parent.appendChild(box);
    return box;
  }

  function copyButton(label, text) {
    const button = el("button", { type: "button", class: "copy" }, label);
    button.addEventListener("click", () => {
      const done = () => { button.textContent = "copied"; };
      if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, () => {});
    });
    return button;
  }

  function showDetails(group) {
    const panel = document.getElementById("details");
    panel.replaceChildren();
    const close = el("button", { type: "button", class: "close", "aria-label": "close" }, "×");
    close.addEventListener("click", () => {
      panel.hidden = true;
      if (cellFromHash() !== null) history.replaceState(null, "", location.pathname + location.search);
    });
    panel.appendChild(close);
    const id = group[0].id;
    panel.appendChild(el("h3", { id: "details-id" }, id));
    const link = el("p", { class: "cell-link" });
    link.appendChild(el("a", { href: anchorOf(id), id: "details-link" }, "link to this cell"));
    link.appendChild(copyButton("copy link", location.href.split("#")[0] + anchorOf(id)));
    panel.appendChild(link);
    for (const c of group) {
      const fingerprint = state.environments[c.env_key] || {};
      const gpu = LAYOUT.gpus[c.env_key] || "";
      panel.appendChild(el("p", { class: "verdict b-" + c.bucket },
        LAYOUT.glyphs[c.bucket] + " " + c.verdict + " · " + c.env_key + (gpu ? " · " + gpu : "")));
      if (c.reason) panel.appendChild(el("p", { class: "reason" }, c.reason));
      const repro = section(panel, "Re-run this cell");
      repro.appendChild(el("pre", { class: "repro" }, c.repro || "(no command recorded)"));
      if (c.repro) repro.appendChild(copyButton("copy command", c.repro));
      const evidence = c.checks.find((k) => k.name === "evidence");
      section(panel, "Kernels / op events seen").appendChild(OpgateEvidence.kernelsView(c.kernels, evidence));
      section(panel, "Checks").appendChild(OpgateEvidence.checksView(c.checks, LAYOUT.severity));
      const meta = section(panel, "Run");
      meta.appendChild(el("p", { class: "muted" },
        "seed " + c.seed + " · attempts " + c.attempts + " · " + c.duration_s + " s"));
      const env = el("details", { class: "fingerprint" });
      env.appendChild(el("summary", {}, "environment " + c.env_key));
      env.appendChild(OpgateEvidence.fields(fingerprint, 0));
      meta.appendChild(env);
    }
    panel.hidden = false;
  }

  // ---- loading compat.json -------------------------------------------------------------------
  function start(doc, source) {
    if (!doc || !Array.isArray(doc.cells)) throw new Error(source + " holds no compat document (no cells)");
    if (doc.schema_version !== LAYOUT.schema_version) {
      throw new Error(source + ": schema_version " + doc.schema_version + ", this page reads " + LAYOUT.schema_version);
    }
    state.environments = doc.environments || {};
    // the modes' order and summaries come with the data (compat.json "modes"); older documents: as the cells come
    const modes = Array.isArray(doc.modes) ? doc.modes : [];
    state.modes = modes.length ? modes.map((m) => m.name) : Array.from(new Set(doc.cells.map((c) => c.axes.mode)));
    state.modeSummary = Object.fromEntries(modes.map((m) => [m.name, m.summary]));
    state.cells = doc.cells.map((c) => ({
      ...c,
      row: c.axes.op + "/" + c.axes.impl,
      column: LAYOUT.column_of[[c.axes.torch, c.axes.cuda, c.axes.arch].join("|")] || c.axes.arch,
      bucket: LAYOUT.buckets[c.verdict] || "fail",
      checks: c.checks || [],
      kernels: c.kernels || [],
    }));
    state.byId = new Map();
    for (const c of state.cells) {
      if (!state.byId.has(c.id)) state.byId.set(c.id, []);
      state.byId.get(c.id).push(c);
    }
    const stale = doc.generated_at !== LAYOUT.generated_at;
    status("loaded", stale ? source + " was published " + doc.generated_at + ", this page " +
      LAYOUT.generated_at + ": the summary and charts above belong to the page, the matrix to the file." : "");
    buildFilters();
    render();
    openFromHash();
  }

  function picker(box) {
    const label = el("label", {}, "Open compat.json: ");
    const input = el("input", { type: "file", id: "load-file", accept: ".json,application/json" });
    input.addEventListener("change", () => {
      const file = input.files && input.files[0];
      if (!file) return;
      const reader = new FileReader();
      reader.onload = () => {
        try { start(JSON.parse(String(reader.result)), file.name); } catch (err) { failed(err); }
      };
      reader.readAsText(file);
    });
    label.appendChild(input);
    box.appendChild(label);
  }

  function failed(err) {
    const local = location.protocol === "file:";
    const box = status("failed", local
      ? "Opened from a file: browsers do not let a page read " + LAYOUT.data + " from disk, so the matrix " +
        "is not shown. Choose the " + LAYOUT.data + " next to this page below, or serve the folder " +
        "and open it over HTTP:"
      : "Could not load " + LAYOUT.data + " (" + err.message + ").");
    const folder = decodeURIComponent(location.pathname.replace(/\/[^/]*$/, "")) || ".";
    if (local) box.appendChild(el("pre", {}, LAYOUT.serve_hint.replace("DIR", "'" + folder + "'")));
    picker(box);
  }

  async function load() {
    window.addEventListener("hashchange", openFromHash);
    window.addEventListener("popstate", openFromHash);
    if (location.protocol === "file:") { // fetch of a file: URL is refused; say so, do not try
      failed(new Error("opened from a file"));
      return;
    }
    try {
      const answer = await fetch(LAYOUT.data, { cache: "no-cache" });
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      start(await answer.json(), LAYOUT.data);
    } catch (err) {
      failed(err);
    }
  }

  load();
})();
