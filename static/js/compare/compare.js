// Compare page: each metric family in one chart with every run's series overlaid, with the run page's
// controls (smoothing, log scale, x by step, epoch, tokens or wall time, which series). A colour per run
// and a line style per TTT step; validation with markers. The legend sits right of the plot, clear of
// the axis titles. The τ of each run below, under the acceptance table (acceptance_heatmap.js).
(function () {
  "use strict";
  // A run's colour comes from its id alone, so that it keeps it whichever runs it is compared with and in
  // whatever order (a colour by position swapped as runs came and went): hues a golden angle apart, so that
  // runs with neighbouring ids differ most. loss_tau.js colours the same runs with it.
  window.runColour = (id) => `hsl(${Math.round((Number(id) * 137.508) % 360)}, 70%, 42%)`;
  const root = document.getElementById("compare-plots");
  if (!root) return;
  const runs = JSON.parse(document.getElementById("compare-chart-runs").textContent);
  const DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"];
  const UNSMOOTHED = new Set(["lr", "tokens_seen", "epoch"]);  // schedules and running totals, as on the run page
  // The summed train loss ("loss") is several times each step's loss_i: it has a chart of its own, where it
  // would squash loss_0..2 at the bottom of theirs.
  const familyOf = (key) => /_\d+$/.test(key) ? key.replace(/_\d+$/, "") : key === "loss" ? "loss_sum" : key;
  const TITLES = {loss_sum: "loss summed over the TTT steps"};
  const ORDER = ["loss", "loss_sum", "full_acc", "cond_acc", "lr", "tokens_per_s", "tokens_seen"];
  const tttOf = (key) => { const m = key.match(/_(\d+)$/); return m ? Number(m[1]) : 0; };
  const opts = {smooth: 0, log: false, x: "step", split: "both", hidden: new Set()};
  const data = [];  // per run: {run, colour, series: [...]}
  const divs = {};

  function smoothed(values) {  // TensorBoard's debiased EMA, as curves.js
    const w = opts.smooth;
    if (!w) return values;
    const out = new Array(values.length);
    let last = 0;
    for (let i = 0; i < values.length; i++) { last = last * w + (1 - w) * values[i]; out[i] = last / (1 - Math.pow(w, i + 1)); }
    return out;
  }

  function tokensAt(tokens, step) {  // tokens_seen is cumulative: interpolate between its points
    if (!tokens || !tokens.steps.length) return null;
    const st = tokens.steps, v = tokens.values;
    if (step <= st[0]) return v[0];
    if (step >= st[st.length - 1]) return v[v.length - 1];
    let lo = 0, hi = st.length - 1;
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (st[mid] <= step) lo = mid; else hi = mid; }
    return v[lo] + (step - st[lo]) / (st[hi] - st[lo]) * (v[hi] - v[lo]);
  }

  // Epochs as a trainer reports them: a pipeline run's are fractional (step / steps per epoch), a run trained
  // elsewhere may send whole numbers (or none: 0), which put every point of an epoch on one vertical line.
  // Whole epochs are spread over the steps between the epoch's first step and the next epoch's; the last epoch
  // at the pace of the one before it. null: the points cannot be placed (say why: `unplaced`).
  function epochsOf(s) {
    const e = s.epochs;
    if (!e.length || e.some((v) => !Number.isInteger(v)) || e.every((v, i) => i === 0 || v !== e[i - 1])) return e;
    const starts = [];  // [epoch, first step]
    e.forEach((v, i) => { if (!starts.length || starts[starts.length - 1][0] !== v) starts.push([v, s.steps[i]]); });
    if (starts.length < 2) return null;  // one whole epoch and no end to it: no step can say how far into it
    const spans = starts.slice(1).map(([v, step], j) => (step - starts[j][1]) / (v - starts[j][0]));
    return s.steps.map((step, i) => {
      const j = starts.findIndex(([v]) => v === e[i]);
      const span = spans[Math.min(j, spans.length - 1)];
      return span > 0 ? starts[j][0] + (step - starts[j][1]) / span : null;
    });
  }

  const unplaced = new Map();  // run name -> why its points are not drawn against this x axis

  function xs(entry, s) {
    if (opts.x === "epoch") {
      const x = epochsOf(s);
      if (x === null) unplaced.set(entry.run.name, "it reported one whole epoch number for every point, so no point can be placed within the epoch; x = step places them");
      return x || [];
    }
    if (opts.x === "tokens") {
      if (!entry.tokens) {
        unplaced.set(entry.run.name, "it reported no tokens_seen series; x = step or wall time places its points");
        return [];
      }
      return s.steps.map((step) => tokensAt(entry.tokens, step));
    }
    if (opts.x === "time") return s.times.map((t) => t - entry.t0);  // seconds since the run's first point
    return s.steps;
  }

  function traces(family) {
    const out = [];
    for (const entry of data) {
      for (const s of entry.series) {
        if (familyOf(s.key) !== family || opts.hidden.has(s.key)) continue;
        if (opts.split !== "both" && s.split !== opts.split) continue;
        const val = s.split === "val";
        const y = !val && !UNSMOOTHED.has(family) ? smoothed(s.values) : s.values;
        out.push({x: xs(entry, s), y, name: dom.plotlyText(`${entry.run.name}: ${s.split} ${s.key}`), legendgroup: String(entry.run.id),
          type: val ? "scatter" : "scattergl", mode: val ? "lines+markers" : "lines",
          line: {color: entry.colour, dash: DASHES[tttOf(s.key) % DASHES.length], width: 1.6}, marker: {size: 5}});
      }
    }
    return out;
  }

  function draw(family) {
    if (!divs[family]) {
      const div = document.createElement("div");
      div.className = "plot";
      div.id = "compare-" + family;
      root.appendChild(div);
      divs[family] = div;
    }
    const xTitle = {step: "step", epoch: "epoch (1 = the end of the first)", tokens: "tokens seen",
      time: "seconds since the run's first point"}[opts.x];
    const shown = traces(family);
    if (!shown.length) {
      // Plotly draws empty axes (−1..6) for no trace: say instead why the chart is empty.
      Plotly.purge(divs[family]);
      divs[family].classList.add("plot-empty");
      divs[family].textContent = `${TITLES[family] || family}: no series shown. Tick one of its series under Series` +
        (opts.split === "both" ? "." : ", or show both splits.");
      return;
    }
    divs[family].classList.remove("plot-empty");
    if (!divs[family].querySelector(".plot-container")) divs[family].replaceChildren();
    // The legend sits right of the plot, in its own margin: it can never cover an axis or its title.
    Plotly.react(divs[family], shown, {
      title: {text: dom.plotlyText(TITLES[family] || family)}, height: 380, margin: {l: 60, r: 260, t: 40, b: 50},
      xaxis: {title: {text: xTitle}}, yaxis: {type: opts.log ? "log" : "linear"},
      legend: {orientation: "v", x: 1.02, xanchor: "left", y: 1, yanchor: "top", font: {size: 10}},
    }, {displaylogo: false, responsive: true});
  }

  function drawAll() {
    unplaced.clear();
    // The run page's order (curves.js): losses first, then accuracies, the schedule, throughput; others after.
    const rank = (f) => { const i = ORDER.indexOf(f); return i < 0 ? ORDER.length : i; };
    const families = [...new Set(data.flatMap((e) => e.series.map((s) => familyOf(s.key))))]
      .sort((x, y) => rank(x) - rank(y) || (x < y ? -1 : x > y ? 1 : 0));
    for (const f of families) draw(f);
    const note = document.getElementById("compare-unplaced");
    note.replaceChildren(...[...unplaced].map(([name, why]) => dom.el("li", {}, `${name} is not drawn against this x axis: ${why}.`)));
    note.hidden = !unplaced.size;
  }

  function seriesPicker() {
    const keys = [...new Set(data.flatMap((e) => e.series.map((s) => s.key)))].sort();
    const box = document.getElementById("compare-series");
    for (const k of keys) {
      box.append(dom.el("label", {}, dom.el("input", {type: "checkbox", checked: true, dataset: {key: k}}), " " + k), " ");
    }
    box.addEventListener("change", (ev) => {
      const key = ev.target.dataset.key;
      if (ev.target.checked) opts.hidden.delete(key); else opts.hidden.add(key);
      drawAll();
    });
  }

  function drawTau() {
    const measured = runs.filter((r) => r.tau != null);
    if (!measured.length) {
      document.getElementById("compare-tau").textContent = "None of these runs has a measured τ yet.";
      return;
    }
    Plotly.newPlot("compare-tau", [{type: "bar", x: measured.map((r) => dom.plotlyText(r.name)), y: measured.map((r) => r.tau),
      marker: {color: measured.map((r) => window.runColour(r.id))},
      text: measured.map((r) => r.tau.toFixed(2)), textposition: "auto", hovertemplate: "%{x}: τ %{y:.3f}<extra></extra>"}],
      {title: {text: "τ measured"}, height: 320, margin: {l: 50, r: 10, t: 40, b: 80}, yaxis: {rangemode: "tozero"}},
      {displaylogo: false, responsive: true});
    // The acceptance per draft position is the table above it (static/js/compare/acceptance_heatmap.js): the best
    // checkpoint's measurement of each run against a baseline run.
  }

  async function load() {
    await Promise.all(runs.map(async (run, i) => {
      const resp = await fetch(run.url + "?points=1000", {headers: {Accept: "application/json"}});
      const series = (await resp.json()).series;
      const times = series.flatMap((s) => s.times.slice(0, 1));
      data[i] = {run, colour: window.runColour(run.id), series,
        tokens: series.find((s) => s.split === "train" && s.key === "tokens_seen"),
        t0: times.length ? Math.min(...times) : 0};
    }));
    seriesPicker();
    drawAll();
    drawTau();
    root.dataset.drawn = "1";
  }

  for (const [id, key] of [["compare-smooth", "smooth"], ["compare-log", "log"], ["compare-x", "x"], ["compare-split", "split"]]) {
    const input = document.getElementById(id);
    input.addEventListener("input", () => {
      opts[key] = input.type === "checkbox" ? input.checked : input.type === "range" ? Number(input.value) : input.value;
      if (key === "smooth") document.getElementById("compare-smooth-value").textContent = opts.smooth.toFixed(2);
      drawAll();
    });
  }
  load();
})();
