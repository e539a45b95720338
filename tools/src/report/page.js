"use strict";
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const svg = document.getElementById("graph");
  const detail = document.getElementById("detail");
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  };
  const us = (s) => (s === null || s === undefined) ? "—" : (s * 1e6).toFixed(s * 1e6 < 10 ? 2 : 1) + " µs";
  const bytes = (b) => {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let v = b, i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + u[i];
  };
  const row = (cells, cls) => {
    const tr = el("tr", cls ? { class: cls } : {});
    for (const c of cells) {
      const num = typeof c === "number" || (typeof c === "string" && /^[\d.]+ (µs|B|KiB|MiB|GiB)$/.test(c));
      tr.append(el("td", num ? { class: "num" } : {}, c));
    }
    return tr;
  };
  const table = (head, rows) => {
    const t = el("table");
    const h = el("tr"); for (const c of head) h.append(el("th", {}, c)); t.append(h);
    for (const r of rows) t.append(r);
    return t;
  };
  // Summary line.
  const s = D.search;
  document.getElementById("summary").textContent =
    `${Object.keys(D.ops).length} ops of rank ${D.rank}'s training step, ${D.boxes.length} boxes` +
    (D.cell ? `, repeated cell ${D.cell}` : "") +
    (D.stages > 1 ? `, ${D.stages} pipeline stages` : "") +
    (s ? `; searcher ${s.searcher}: predicted step ${(s.predicted_step_seconds * 1e3).toFixed(3)} ms` : "") +
    (D.measured ? `; measured times of rank ${D.measured.rank} over ${D.measured.steps} steps (run --stats)` :
      "; no measured times (run the artifact with --stats to add them)");

  let selected = null;
  function select(boxIndex) {
    if (selected) selected.classList.remove("selected");
    selected = svg ? svg.querySelector(`g.box[data-box="${boxIndex}"]`) : null;
    if (selected) {
      selected.classList.add("selected");
      const wrap = document.getElementById("graphwrap");
      const r = selected.getBoundingClientRect(), w = wrap.getBoundingClientRect();
      if (r.top < w.top || r.bottom > w.bottom || r.left < w.left || r.right > w.right)
        selected.scrollIntoView({ block: "center", inline: "center" });
    }
  }
  function showOp(name) {
    const o = D.ops[name];
    detail.replaceChildren();
    if (!o) { detail.append(el("p", { class: "hint" }, `No op named ${name} in this report.`)); return; }
    select(o.box);
    const b = D.boxes[o.box];
    detail.append(el("h3", { id: "detail-op" }, `${o.name} (${o.kind})`));
    const legend = D.legend.find((l) => l[0] === o.split);
    detail.append(el("p", {}, el("span", { class: "swatch", style: `background:${legend ? legend[2] : "#fff"}` }),
      `${legend ? legend[1] : o.split} · ${o.phase}` + (o.layer !== null ? ` · layer ${o.layer}` : "")));
    if (b && b.label) detail.append(el("p", { class: "hint" }, `Drawn folded in “${b.label}”.`));
    const kv = [["strategy", el("code", { id: "detail-strategy" }, o.strategy)], ["from", o.source],
      ["device matrix", el("code", {}, o.dev_matrix)], ["scope", el("code", {}, o.scope)]];
    o.inputs.forEach((l, i) => kv.push([`input ${i}`, el("code", {}, l)]));
    o.outputs.forEach((l, i) => kv.push([`result ${i}`, el("code", {}, l)]));
    detail.append(table(["", ""], kv.map((r) => row(r))));
    const p = o.predicted || {};
    let commMeasured = null;
    for (const c of o.comms) { const m = D.comms[c].measured; if (m !== null) commMeasured = (commMeasured || 0) + m; }
    detail.append(el("h4", {}, "Time per step"));
    detail.append(table(["", "predicted", "measured"], [
      row(["compute", us(p.compute_seconds), us(o.measured)]),
      row(["communication", us(p.communication_seconds), us(commMeasured)]),
    ]));
    if (o.candidates.length === 0) {
      detail.append(el("p", {}, "Candidates: none weighed (the strategy was given, or follows a weight)."));
    } else {
      const unit = o.searched ? "µs" : "bytes-eq.";
      const f = (x) => o.searched ? (x * 1e6).toFixed(3) : x.toFixed(0);
      detail.append(el("h4", {}, `Candidates weighed (${o.candidates.length + o.more_candidates}), cheapest first`));
      detail.append(table(["strategy", `total ${unit}`, "compute", "comm.", "memory"],
        o.candidates.map((c) => row([c[0], f(c[1] + c[2]), f(c[1]), f(c[2]), bytes(c[3])], c[4] ? "chosen" : ""))));
      if (o.more_candidates > 0) detail.append(el("p", { class: "hint" }, `${o.more_candidates} more not kept (--max-candidates).`));
    }
    detail.append(el("h4", {}, `Communication around it on rank ${D.rank}`));
    if (o.comms.length === 0) {
      detail.append(el("p", {}, "None: its inputs arrive and its results leave in the layouts they need."));
    } else {
      detail.append(table(["collective", "edge", "bytes/step", "measured"], o.comms.map((i) => {
        const c = D.comms[i];
        return row([el("span", { title: `${c.instance}\nrule: ${c.rule}\ngroup: ${c.group}` }, `${c.op} ${c.group}`),
          `${c.from} → ${c.to}`, bytes(c.bytes), us(c.measured)]);
      })));
    }
  }
  function showBox(i) {
    const b = D.boxes[i];
    if (!b) return;
    if (b.op) { location.hash = "op=" + encodeURIComponent(b.op); return; }
    select(i);
    detail.replaceChildren(el("h3", { id: "detail-op" }, b.label));
    let pc = 0, pm = 0, mc = 0, any = false;
    for (const n of b.ops) {
      const o = D.ops[n]; if (!o) continue;
      if (o.predicted) { pc += o.predicted.compute_seconds; pm += o.predicted.communication_seconds; }
      if (o.measured !== null) { mc += o.measured; any = true; }
    }
    detail.append(el("p", {}, b.updates ? `${b.ops.length} optimizer updates (and their Assigns), each following its weight's layout.` :
      `${b.ops.length} ops of layers ${b.layers[0]}–${b.layers[1]}, each with the same strategy as the op at its place in the first layer of their run.`));
    detail.append(table(["", "predicted", "measured"], [row(["compute", us(pc), any ? us(mc) : "—"]), row(["communication", us(pm), "—"])]));
    const list = el("ul");
    for (const n of b.ops.slice(0, 400)) list.append(el("li", {}, el("a", { href: "#op=" + encodeURIComponent(n) }, n), ` ${D.ops[n] ? D.ops[n].strategy : ""}`));
    detail.append(list);
  }
  function fromHash() {
    const m = /^#op=(.+)$/.exec(location.hash);
    if (m) showOp(decodeURIComponent(m[1]));
  }
  if (svg) {
    svg.addEventListener("click", (ev) => {
      const g = ev.target.closest("g.box");
      if (g) showBox(Number(g.getAttribute("data-box")));
    });
    let scale = 1;
    const w0 = Number(svg.getAttribute("width")), h0 = Number(svg.getAttribute("height"));
    const apply = () => { svg.setAttribute("width", w0 * scale); svg.setAttribute("height", h0 * scale); };
    document.getElementById("zoomin").onclick = () => { scale *= 1.25; apply(); };
    document.getElementById("zoomout").onclick = () => { scale /= 1.25; apply(); };
    document.getElementById("zoomfit").onclick = () => {
      const w = document.getElementById("graphwrap").clientWidth;
      scale = Math.min(1, w / w0); apply();
    };
  }
  window.addEventListener("hashchange", fromHash);
  fromHash();
  // Without a selection, start at the first op of the step (the graph may be wider than
  // the window).
  if (!selected && svg) {
    const first = svg.querySelector('g.box[data-box="0"]');
    if (first) first.scrollIntoView({ block: "nearest", inline: "center" });
  }

  // Memory per rank: one bar per group of ranks with the same memory.
  const chart = document.getElementById("memchart");
  const max = Math.max(1, ...D.memory.map((g) => g.weights + g.optimizer_state + g.activations_peak + g.inputs));
  chart.append(el("p", { class: "hint" },
    "Per rank, from its graph's shapes: weights (trained parameters' blocks), optimizer state (moments, counters), " +
    "activations peak (the memory plan's live peak of the step's intermediate values: activations kept for the backward pass, gradients, temporaries), inputs (the rank's data block)." +
    (D.memory_ranks.length < D.device_num ? ` Measured on ranks ${D.memory_ranks.join(", ")} (first and last of each stage).` : "")));
  const legend = el("p");
  for (const [c, n] of [["m-weights", "weights"], ["m-opt", "optimizer state"], ["m-act", "activations peak"], ["m-in", "inputs"]])
    legend.append(el("span", { class: "swatch " + c }), n + "  ");
  chart.append(legend);
  for (const g of D.memory) {
    const tot = g.weights + g.optimizer_state + g.activations_peak + g.inputs;
    const lab = (g.ranks[0] === g.ranks[1] ? `rank ${g.ranks[0]}` : `ranks ${g.ranks[0]}–${g.ranks[1]}`) + (g.stage !== null ? ` (stage ${g.stage})` : "");
    const bar = el("div", { class: "bar" }, el("span", { class: "lab" }, lab));
    for (const [k, c] of [["weights", "m-weights"], ["optimizer_state", "m-opt"], ["activations_peak", "m-act"], ["inputs", "m-in"]])
      bar.append(el("span", { class: "seg " + c, style: `width:${(600 * g[k] / max).toFixed(1)}px`, title: `${k}: ${bytes(g[k])}` }));
    bar.append(el("span", { class: "tot" }, bytes(tot)));
    chart.append(bar);
  }
})();
