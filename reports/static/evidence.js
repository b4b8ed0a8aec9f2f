// opgate dashboard: one cell's evidence, readable.  Kernel names are shortened
// and grouped by what they mean for the verdict (expected, forbidden, copies),
// comparisons show the worst element, other details are laid out as fields,
// never dumped as JSON.  Every string reaches the DOM through textContent.
"use strict";
const OpgateEvidence = (function () {
  const LIST_SHOWN = 12; // longer lists show their first items and a count
  const NAME_MAX = 110; // a shortened name longer than this is cut in the middle

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // The name at template depth 0 (arguments dropped, template arguments folded to <…>), and
  // the identifiers inside the template arguments: "elementwise_kernel<…direct_copy_kernel_cuda…>".
  function cppParts(name) {
    let depth = 0, braces = 0, outer = "", inner = "";
    for (let i = 0; i < name.length; i += 1) {
      const ch = name[i];
      if (depth === 0 && braces === 0 && name.startsWith("(anonymous namespace)", i)) {
        outer += "‹anon›";
        i += "(anonymous namespace)".length - 1;
      } else if (ch === "{") {
        braces += 1;
      } else if (ch === "}") {
        braces = Math.max(0, braces - 1);
      } else if (braces > 0) {
        // lambda bodies: {lambda(float)#1}
      } else if (ch === "<") {
        if (depth === 0) outer += "<…>";
        depth += 1;
      } else if (ch === ">") {
        depth = Math.max(0, depth - 1);
      } else if (ch === "(" && depth === 0) {
        break; // the argument list of a function: not part of its name
      } else if (depth === 0) {
        outer += ch;
      } else {
        inner += ch;
      }
    }
    return { outer: outer.trim(), inner };
  }

  function hint(inner) {
    const calls = [...inner.matchAll(/([A-Za-z_]\w*)\s*\(/g)].map((m) => m[1])
      .filter((w) => !["operator", "lambda", "anonymous"].includes(w));
    if (calls.length) return calls[0];
    const words = (inner.match(/[A-Za-z_]\w*/g) || []).filter((w) => !/^(void|const|unsigned|int|long|bool|char|float|double|at|c10|native|cutlass|std)$/.test(w));
    return words.sort((a, b) => b.length - a.length)[0] || "";
  }

  function cut(text) {
    if (text.length <= NAME_MAX) return text;
    const half = Math.floor((NAME_MAX - 1) / 2);
    return text.slice(0, half) + "…" + text.slice(text.length - half);
  }

  // A demangled C++ kernel name, a Triton kernel name or a copy record
  // ("aten::copy_ Half[8, 64] <- Half[8, 64] [void at::native::elementwise_kernel<...>(...)]").
  function shortName(name) {
    const text = String(name);
    const bracket = text.indexOf(" [");
    if (bracket > 0 && text.endsWith("]")) {
      return cut(text.slice(0, bracket)) + " [" + shortName(text.slice(bracket + 2, -1)) + "]";
    }
    if (!/[<(]/.test(text)) return cut(text);
    const { outer, inner } = cppParts(text.replace(/^void\s+/, ""));
    const word = hint(inner);
    const named = word && outer.includes("<…>") ? outer.replace("<…>", "<…" + word + "…>") : outer;
    return cut(named || text);
  }

  // An expect/forbid pattern as validators.profiling matches it: fnmatch globs, "|" between alternatives.
  function globRegex(pattern) {
    const alternatives = String(pattern).split("|").map((alt) => {
      let rx = "";
      for (const ch of alt) {
        if (ch === "*") rx += ".*";
        else if (ch === "?") rx += ".";
        else rx += ch.replace(/[.+^${}()|[\]\\]/g, "\\$&");
      }
      return rx;
    });
    return new RegExp("^(?:" + alternatives.join("|") + ")$", "s");
  }

  // Names grouped by their short form: [{short, names: [full...], count}], most frequent first.
  function group(names) {
    const by = new Map();
    for (const name of names) {
      const short = shortName(name);
      if (!by.has(short)) by.set(short, { short, names: new Set(), count: 0 });
      const entry = by.get(short);
      entry.names.add(String(name));
      entry.count += 1;
    }
    return [...by.values()].sort((a, b) => b.count - a.count || a.short.localeCompare(b.short));
  }

  function kernelList(title, names, cls) {
    const box = el("div", { class: "kgroup " + (cls || "") });
    box.appendChild(el("h5", {}, title + " (" + names.length + ")"));
    const ul = el("ul", { class: "kernels" });
    for (const g of group(names)) {
      const li = el("li", { title: [...g.names].join("\n") });
      li.appendChild(el("code", { class: "kname" }, g.short));
      if (g.count > 1) li.appendChild(el("span", { class: "count" }, " ×" + g.count));
      if (g.names.size > 1 || [...g.names][0] !== g.short) {
        const more = el("details", { class: "fullnames" });
        more.appendChild(el("summary", {}, g.names.size > 1 ? g.names.size + " full names" : "full name"));
        for (const full of g.names) more.appendChild(el("pre", {}, full));
        li.appendChild(more);
      }
      ul.appendChild(li);
    }
    box.appendChild(ul);
    return box;
  }

  // Kernels by role: expected and seen, forbidden and seen, copies, the rest.
  function kernelsView(kernels, evidence) {
    const box = el("div", { class: "kernels-view" });
    const d = (evidence && evidence.details) || {};
    const seen = (d.seen && d.seen.length ? d.seen : kernels) || [];
    if (!seen.length && !(d.copies || []).length) {
      box.appendChild(el("p", { class: "muted" }, "no kernels or op events recorded"));
      return box;
    }
    const expect = (d.expect || []).map(globRegex);
    const forbidden = new Set(Object.values(d.forbidden || {}).flat().map(String));
    const expected = seen.filter((k) => expect.some((rx) => rx.test(k)));
    const bad = seen.filter((k) => forbidden.has(String(k)));
    const rest = seen.filter((k) => !expected.includes(k) && !bad.includes(k));
    if (d.expect) {
      const line = el("p", { class: "expectation" });
      line.textContent = "expected: " + d.expect.join(", ") +
        (d.forbid && d.forbid.length ? " · forbidden: " + d.forbid.join(", ") : "");
      box.appendChild(line);
    }
    if ((d.missing || []).length) {
      box.appendChild(el("p", { class: "missing" }, "expected but NOT seen: " + d.missing.join(", ")));
    }
    if (expected.length) box.appendChild(kernelList("expected, seen", expected, "ok"));
    if (bad.length) box.appendChild(kernelList("forbidden, seen", bad, "bad"));
    if ((d.copies || []).length) {
      const title = "copies (" + (d.extra_copies ?? d.copies.length) + " beyond the reference's, " +
        (d.copies_allowed ?? 0) + " allowed)";
      box.appendChild(kernelList(title, d.copies, d.extra_copies > (d.copies_allowed || 0) ? "bad" : ""));
    }
    if ((d.reference_copies || []).length) {
      box.appendChild(kernelList("the reference's own copies", d.reference_copies, "muted"));
    }
    if (rest.length) box.appendChild(kernelList(d.expect ? "other kernels" : "kernels seen", rest, ""));
    return box;
  }

  function num(v) {
    if (v === null || v === undefined) return "—";
    if (typeof v !== "number") return String(v);
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e4 || a < 1e-3 ? v.toExponential(3) : String(Number(v.toPrecision(4)));
  }

  function comparisonsView(details) {
    const table = el("table", { class: "comparisons" });
    const head = el("tr");
    for (const h of ["output", "", "error vs oracle", "allowed", "reference error", "worst element",
      "op", "reference", "oracle"]) head.appendChild(el("th", {}, h));
    table.appendChild(head);
    const rows = details.comparisons.slice().sort((a, b) => Number(a.passed) - Number(b.passed));
    for (const c of rows) {
      const tr = el("tr", { class: c.passed ? "ok" : "bad" });
      tr.appendChild(el("td", {}, c.label));
      tr.appendChild(el("td", {}, c.passed ? "✓" : "✗"));
      if (c.problem) {
        tr.appendChild(el("td", { colspan: "7" }, c.problem));
      } else {
        const nonfinite = c.op_nonfinite ? " (" + c.op_nonfinite + " non-finite)" : "";
        if (c.op_ulps !== undefined) {  // the ulp rule (validators/tolerance.py): ulps, then the absolute error
          tr.appendChild(el("td", {}, num(c.op_ulps) + " ulp (" + num(c.op_err) + ")" + nonfinite));
          tr.appendChild(el("td", {}, num(c.allowed_ulps) + " ulp"));
          tr.appendChild(el("td", {}, num(c.ref_ulps) + " ulp (" + num(c.ref_err) + ")"));
        } else {  // records written before the ulp rule: absolute errors
          tr.appendChild(el("td", {}, num(c.op_err) + nonfinite));
          tr.appendChild(el("td", {}, num(c.allowed)));
          tr.appendChild(el("td", {}, num(c.ref_err)));
        }
        tr.appendChild(el("td", {}, c.worst_index ? "[" + c.worst_index.join(", ") + "]" : "—"));
        const w = c.worst_values;
        for (const k of ["op", "reference", "oracle"]) {
          tr.appendChild(el("td", { title: w ? "" : "this run did not record the values" }, w ? num(w[k]) : "—"));
        }
      }
      table.appendChild(tr);
    }
    return table;
  }

  function fieldValue(value, depth) {
    if (value === null || value === undefined || typeof value !== "object") {
      return el("span", {}, value === null || value === undefined ? "—" : String(value));
    }
    if (Array.isArray(value)) {
      if (value.every((v) => v === null || typeof v !== "object")) {
        const shown = value.slice(0, LIST_SHOWN).map(String).join(", ");
        return el("span", {}, "[" + shown + (value.length > LIST_SHOWN ? ", … " + (value.length - LIST_SHOWN) + " more" : "") + "]");
      }
      const ol = el("ol", { class: "fields" });
      for (const v of value.slice(0, LIST_SHOWN)) {
        const li = el("li");
        li.appendChild(fieldValue(v, depth + 1));
        ol.appendChild(li);
      }
      if (value.length > LIST_SHOWN) ol.appendChild(el("li", { class: "muted" }, "… " + (value.length - LIST_SHOWN) + " more"));
      return ol;
    }
    return fields(value, depth + 1);
  }

  function fields(obj, depth) {
    if (depth > 3) return el("span", {}, JSON.stringify(obj));
    const dl = el("dl", { class: "fields" });
    for (const [k, v] of Object.entries(obj)) {
      dl.appendChild(el("dt", {}, k));
      const dd = el("dd");
      if (typeof v === "string" && v.includes("\n")) dd.appendChild(el("pre", {}, v));
      else dd.appendChild(fieldValue(v, depth));
      dl.appendChild(dd);
    }
    return dl;
  }

  const TEXT_KEYS = ["error", "traceback", "message", "exception", "stderr", "log"];

  // One check's details: comparisons as a table, errors as text, the rest as fields.
  function checkDetails(check) {
    const d = check.details || {};
    const box = el("div", { class: "check-details" });
    for (const key of TEXT_KEYS) {
      if (typeof d[key] === "string" && d[key]) box.appendChild(el("pre", { class: "error" }, d[key]));
    }
    if (Array.isArray(d.comparisons) && d.comparisons.length) {
      if (d.rule && d.rule.slack_ulps !== undefined) {
        box.appendChild(el("p", { class: "rule" }, "allowed = " + d.rule.k + " × reference error + " +
          d.rule.slack_ulps + " ulp, in ulps of the output dtype at each element's magnitude (at least one ulp " +
          "of the output's rms); an absolute error ≤ " + d.rule.k + " × " + d.rule.atol_floor + " always passes"));
      } else if (d.rule) {
        box.appendChild(el("p", { class: "rule" }, "allowed = " + d.rule.k + " × max(reference error, " +
          d.rule.atol_floor + "): the op may be " + d.rule.k + "× as far from the float64 oracle as the reference"));
      }
      box.appendChild(comparisonsView(d));
    }
    const rest = {};
    const shown = new Set([...TEXT_KEYS, "comparisons", "rule", "seen", "expect", "forbid", "missing",
      "forbidden", "copies", "reference_copies", "checks"]);
    for (const [k, v] of Object.entries(d)) if (!shown.has(k)) rest[k] = v;
    if (Object.keys(rest).length) box.appendChild(fields(rest, 0));
    if (Array.isArray(d.checks)) {
      box.appendChild(el("h5", {}, "checks of this attempt"));
      for (const c of d.checks) box.appendChild(checkBlock(c, false));
    }
    return box;
  }

  function checkBlock(check, open) {
    const bad = !["pass", "skip"].includes(check.status);
    const block = el("details", { class: "check s-" + check.status });
    if (open && bad) block.setAttribute("open", "");
    const summary = el("summary");
    summary.appendChild(el("span", { class: "check-name" }, check.name));
    summary.appendChild(el("span", { class: "check-status" }, check.status));
    summary.appendChild(el("span", { class: "check-summary" }, check.summary || ""));
    summary.appendChild(el("span", { class: "check-time muted" }, (check.duration_s || 0).toFixed(2) + " s"));
    block.appendChild(summary);
    if (check.details && Object.keys(check.details).length) block.appendChild(checkDetails(check));
    else block.appendChild(el("p", { class: "muted" }, bad ? "no details recorded" : "details are kept for checks that did not pass"));
    return block;
  }

  // The checks, worst first: what made the verdict is what a reader looks for.
  function checksView(checks, severity) {
    const box = el("div", { class: "checks" });
    const rank = (c) => { const i = severity.indexOf(c.status); return i < 0 ? severity.length : i; };
    for (const check of checks.slice().sort((a, b) => rank(a) - rank(b))) box.appendChild(checkBlock(check, true));
    return box;
  }

  return { shortName, group, globRegex, kernelsView, checksView, fields, el };
})();
