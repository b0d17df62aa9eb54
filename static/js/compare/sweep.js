// Sweep page: tau against a swept setting (a line per combination of the other settings, the best run
// starred) and, with two or more swept settings, parallel coordinates; polls the sweep's JSON while
// runs are unfinished and updates the table's status and tau cells.
(function () {
  "use strict";
  const page = document.getElementById("sweep-page");
  if (!page) return;
  const numeric = new Set(JSON.parse(document.getElementById("sweep-numeric-keys").textContent));
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const select = document.getElementById("sweep-x");
  let summary = JSON.parse(document.getElementById("sweep-summary").textContent);

  // A swept key is drawn on a number axis when it is numeric and every value reads as a number.
  function axisOf(key) {
    const texts = summary.varied[key];
    const nums = texts.map(Number);
    if (numeric.has(key) && nums.every(Number.isFinite)) {
      const positive = nums.filter((n) => n > 0);
      const spread = positive.length === nums.length && Math.max(...nums) / Math.min(...nums) >= 10;
      return {type: spread ? "log" : "linear", value: Number};
    }
    return {type: "category", value: dom.plotlyText, order: texts.map(dom.plotlyText)};
  }

  function drawScatter() {
    const keys = summary.keys;
    const x = select ? select.value : keys[0];
    const axis = axisOf(x);
    const others = keys.filter((k) => k !== x);
    const groups = new Map();
    for (const run of summary.runs) {
      const label = others.map((k) => `${k}=${run.settings[k]}`).join(" ") || "runs";
      if (!groups.has(label)) groups.set(label, []);
      groups.get(label).push(run);
    }
    const traces = [...groups.entries()].map(([label, runs], i) => {
      const measured = runs.filter((r) => r.tau !== null);
      return {x: measured.map((r) => axis.value(r.settings[x])), y: measured.map((r) => r.tau), name: dom.plotlyText(label),
        text: measured.map((r) => dom.plotlyText(r.name)), mode: "lines+markers", type: "scatter",
        line: {color: PALETTE[i % PALETTE.length], width: 1.5}, marker: {size: 8},
        hovertemplate: "%{text}<br>" + dom.plotlyText(x) + "=%{x}<br>τ %{y:.3f}<extra></extra>"};
    });
    const best = summary.runs.find((r) => r.is_best);
    if (best) {
      traces.push({x: [axis.value(best.settings[x])], y: [best.tau], name: "best", mode: "markers", type: "scatter",
        marker: {symbol: "star", size: 18, color: "#f9a825", line: {color: "#1d232a", width: 1}},
        hovertemplate: `best: ${dom.plotlyText(best.name)}<br>τ %{y:.3f}<extra></extra>`});
    }
    const measured = summary.runs.filter((r) => r.tau !== null).length;
    const xaxis = {title: {text: dom.plotlyText(x)}, type: axis.type, automargin: true, exponentformat: "e"};
    if (axis.order) { xaxis.categoryorder = "array"; xaxis.categoryarray = axis.order; }
    Plotly.react("plot-sweep", traces, {
      height: 360, margin: {l: 60, r: 10, t: 30, b: 50}, xaxis, yaxis: {title: {text: "τ (acceptance length)"}},
      legend: {orientation: "h", y: -0.3}, showlegend: traces.length > 1,
      annotations: measured ? [] : [{text: "no τ measured yet", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5}],
    }, {displaylogo: false, responsive: true});
  }

  function drawParcoords() {
    if (!document.getElementById("plot-parcoords")) return;
    const runs = summary.runs.filter((r) => r.tau !== null);
    const dimensions = summary.keys.map((key) => {
      const axis = axisOf(key);
      if (axis.type !== "category") {
        const values = runs.map((r) => Number(r.settings[key]));
        return axis.type === "log"
          ? {label: dom.plotlyText(key + " (log10)"), values: values.map(Math.log10)}
          : {label: dom.plotlyText(key), values};
      }
      const order = summary.varied[key];
      return {label: dom.plotlyText(key), values: runs.map((r) => order.indexOf(r.settings[key])),
        tickvals: order.map((_, i) => i), ticktext: order.map(dom.plotlyText), range: [0, Math.max(order.length - 1, 1)]};
    });
    dimensions.push({label: "τ", values: runs.map((r) => r.tau)});
    Plotly.react("plot-parcoords", [{type: "parcoords", dimensions,
      line: {color: runs.map((r) => r.tau), colorscale: "Viridis", showscale: true, colorbar: {title: {text: "τ"}}}}],
      {height: 360, margin: {l: 60, r: 60, t: 50, b: 30}}, {displaylogo: false, responsive: true});
  }

  function draw() { drawScatter(); drawParcoords(); }

  function updateTable() {
    for (const run of summary.runs) {
      const row = document.querySelector(`#sweep-runs tr[data-run="${run.run_id}"]`);
      if (!row) continue;
      const status = row.querySelector('[data-field="status"]');
      status.textContent = run.status;
      status.className = "status " + run.status;
      row.querySelector('[data-field="tau"]').textContent = run.tau === null ? "–" : run.tau.toFixed(3);
      row.querySelector('[data-field="val_loss"]').textContent = run.val_loss === null ? "–" : run.val_loss.toFixed(4);
      row.querySelector('[data-field="tokens_per_s"]').textContent =
        run.tokens_per_s === null ? "–" : Math.round(run.tokens_per_s).toString();
    }
  }

  async function poll() {
    if (summary.finished) return;
    try {
      const resp = await fetch(page.dataset.statusUrl, {headers: {Accept: "application/json"}});
      if (resp.status === 404) {
        // Every run the viewer saw was moved to a project they do not see (or deleted): say so, stop asking.
        const gone = document.createElement("p");
        gone.className = "message warning";
        gone.id = "sweep-gone";
        gone.textContent = "This sweep's runs are no longer in a project you see (moved or deleted); " +
          "the page stopped following it. Reload to check again.";
        document.getElementById("sweep-best").before(gone);
        return;
      }
      if (resp.ok) {
        const next = await resp.json();
        const bestBefore = summary.best && summary.best.run_id;
        const bestNow = next.best && next.best.run_id;
        const runsBefore = summary.run_ids.join(",");
        summary = next;
        // A new best, runs moved in or out of sight, or the end change the header and the rows: the page
        // draws those itself.
        if (bestBefore !== bestNow || next.finished || next.run_ids.join(",") !== runsBefore) {
          window.location.reload();
          return;
        }
        updateTable();
        draw();
      }
    } catch (err) { /* the server may restart; the next poll tries again */ }
    setTimeout(poll, 5000);
  }

  if (select) select.addEventListener("change", drawScatter);
  draw();
  setTimeout(poll, 5000);
})();
