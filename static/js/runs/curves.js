// Training curves on the run page: one chart per metric family (loss, accuracies, lr, throughput),
// TTT steps as the legend, train solid and validation dashed. The API answers at most POINTS points
// per series (MinMaxLTTB, so spikes survive); zooming asks again for the window at full resolution;
// while the run trains, only the steps after the newest one held are asked for and appended, and a series
// grown to twice POINTS is thinned in the page (thin: each step bucket's lowest and highest point).
(function () {
  "use strict";
  const root = document.getElementById("curves");
  if (!root) return;
  const metricsUrl = root.dataset.metricsUrl;
  const exportUrl = root.dataset.exportUrl;
  const POINTS = 2000;
  // The curves' poll waits at least MIN_POLL_MS, longer while polls find nothing new, at most MAX_POLL_MS.
  const MIN_POLL_MS = 2000, MAX_POLL_MS = 10000;
  const COLUMNS = ["steps", "epochs", "values", "times"];
  const SUMMARY = ["num_points", "first_step", "last_step", "last", "last_epoch", "min", "min_step", "max", "max_step",
    "num_non_finite", "num_refused"];
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const TITLES = {loss: "Loss per TTT step", loss_sum: "Loss summed over the TTT steps", full_acc: "Accuracy per TTT step", cond_acc: "Conditional accuracy per TTT step",
    lr: "Learning rate", tokens_per_s: "Training throughput (tokens/s)", tokens_seen: "Tokens seen"};
  // Hidden-state supply (runs.pipeline.online.selectors): each its own chart, beside the loss's, in its own units.
  const SUPPLY = ["supply/fetch_wait_fraction", "supply/capture_tokens_per_s", "supply/cache_hit_rate"];
  Object.assign(TITLES, {"supply/fetch_wait_fraction": "Supply: share of step time waiting for data",
    "supply/capture_tokens_per_s": "Supply: capture servers' tokens/s", "supply/cache_hit_rate": "Supply: cache hit rate"});
  const fmt = new Intl.NumberFormat("en-US");
  const series = {};  // "split:key" -> {split, key, steps, epochs, values, times, last_step, num_points, ...}
  const charts = {};  // family -> {div, ids: [series ids in trace order], zoomed: bool}
  const opts = {smooth: 0, log: false, x: "step"};
  let runFinished = false;
  let pollMs = MIN_POLL_MS;
  let lastNewsAt = 0;  // when a poll last brought points (performance.now())

  // The summed train loss ("loss") is several times each TTT step's loss_i: its own chart ("loss_sum"), where on
  // theirs it squashed loss_0..2 at the bottom of the axis.
  const familyOf = (key) => /_\d+$/.test(key) ? key.replace(/_\d+$/, "") : key === "loss" ? "loss_sum" : key;
  const tttOf = (key) => { const m = key.match(/_(\d+)$/); return m ? Number(m[1]) : 0; };
  const sid = (s) => s.split + ":" + s.key;

  function smoothed(values) {
    // TensorBoard's debiased exponential moving average: the first points are not pulled to zero.
    const w = opts.smooth;
    if (!w) return values;
    const out = new Array(values.length);
    let last = 0, n = 0;
    for (let i = 0; i < values.length; i++) {
      last = last * w + (1 - w) * values[i];
      n += 1;
      out[i] = last / (1 - Math.pow(w, n));
    }
    return out;
  }

  function tokensAt(step) {
    // tokens_seen is cumulative, so between two of its (downsampled) points it is interpolated.
    const t = series["train:tokens_seen"];
    if (!t || !t.steps.length) return null;
    let lo = 0, hi = t.steps.length - 1;
    if (step <= t.steps[0]) return t.values[0];
    if (step >= t.steps[hi]) return t.values[hi];
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (t.steps[mid] <= step) lo = mid; else hi = mid; }
    const f = (step - t.steps[lo]) / (t.steps[hi] - t.steps[lo]);
    return t.values[lo] + f * (t.values[hi] - t.values[lo]);
  }

  function xs(s) {
    if (opts.x === "epoch") return s.epochs;
    if (opts.x === "tokens") return s.steps.map(tokensAt);
    if (opts.x === "time") return s.times.map((t) => new Date(t * 1000));
    return s.steps;
  }

  // Smoothing means something for noisy per-step figures, not for a schedule or a running total.
  const UNSMOOTHED = new Set(["lr", "tokens_seen", "epoch"]);

  function traces(ids, source = series) {
    const out = [];
    // One colour per curve of the chart (train and val of the same key share it, val dashed).
    const keys = [...new Set(ids.map((id) => source[id].key))];
    for (const id of ids) {
      const s = source[id];
      const color = PALETTE[keys.indexOf(s.key) % PALETTE.length];
      const val = s.split === "val";
      const name = dom.plotlyText(`${s.split} ${s.key}`);
      const base = {x: xs(s), type: val ? "scatter" : "scattergl", legendgroup: name,
        hovertemplate: `${name}<br>%{x}: %{y:.5g}<extra></extra>`};
      if (opts.smooth && !val && !UNSMOOTHED.has(familyOf(s.key))) {
        out.push({...base, y: s.values, name, showlegend: false, mode: "lines", line: {color, width: 1}, opacity: 0.25});
        out.push({...base, y: smoothed(s.values), name, mode: "lines", line: {color, width: 2}});
      } else {
        out.push({...base, y: s.values, name, mode: val ? "lines+markers" : "lines", line: {color, dash: val ? "dash" : "solid"}});
      }
    }
    return out;
  }

  function layout(family, chart) {
    return {
      // The legend in its own right margin: below the plot it ran into the x axis title.
      title: {text: TITLES[family] || dom.plotlyText(family)}, height: 320, margin: {l: 60, r: 125, t: 40, b: 40},
      xaxis: {title: {text: {step: "step", epoch: "epoch", time: "wall time", tokens: "tokens seen"}[opts.x]}, type: opts.x === "time" ? "date" : "linear"},
      yaxis: {type: opts.log ? "log" : "linear", exponentformat: family === "lr" ? "e" : "none"},
      legend: {orientation: "v", x: 1.02, xanchor: "left", y: 1, yanchor: "top", font: {size: 10}},
      uirevision: opts.x + opts.log, datarevision: Date.now(),
    };
  }

  function chartFor(family) {
    if (charts[family]) return charts[family];
    const div = dom.el("div", {id: "plot-" + family, class: "plot"});
    const box = dom.el("div", {class: "plot-box"}, div,
      dom.el("details", {class: "export"}, dom.el("summary", {}, "Export"), dom.el("ul")));
    document.getElementById("curve-plots").appendChild(box);
    charts[family] = {div, box, ids: [], zoomed: false};
    return charts[family];
  }

  function exportLinks(chart) {
    chart.box.querySelector("ul").replaceChildren(...chart.ids.map((id) => {
      const s = series[id];
      const link = (format) => dom.el("a", {download: true,
        href: exportUrl + "?" + new URLSearchParams({key: s.key, split: s.split, format})}, format.toUpperCase());
      return dom.el("li", {}, `${s.split} ${s.key} (${fmt.format(s.num_points)} points): `, link("csv"), " ", link("json"));
    }));
  }

  function draw(family) {
    const chart = chartFor(family);
    chart.ids = Object.keys(series).filter((id) => familyOf(series[id].key) === family)
      .sort((a, b) => tttOf(series[a].key) - tttOf(series[b].key) || a.localeCompare(b));
    Plotly.react(chart.div, traces(chart.ids), layout(family, chart), {displaylogo: false, responsive: true});
    exportLinks(chart);
    if (!chart.listening) {
      chart.listening = true;
      chart.div.on("plotly_relayout", (ev) => zoomed(family, ev));
    }
  }

  function drawAll(only) {
    const families = [...new Set(Object.values(series).map((s) => familyOf(s.key)))];
    const order = ["loss", "loss_sum", ...SUPPLY, "full_acc", "cond_acc", "lr", "tokens_per_s", "tokens_seen"];
    families.sort((a, b) => ((order.indexOf(a) + 1) || 99) - ((order.indexOf(b) + 1) || 99) || a.localeCompare(b));
    // A zoomed chart keeps its window; live points reach it when the user zooms out.
    for (const f of families) if (!only || (only.has(f) && !(charts[f] && charts[f].zoomed))) draw(f);
    const total = Object.values(series).reduce((n, s) => n + s.num_points, 0);
    const shown = Object.values(series).reduce((n, s) => n + s.steps.length, 0);
    const refused = Object.values(series).reduce((n, s) => n + (s.num_refused || 0), 0);
    const nonFinite = Object.values(series).reduce((n, s) => n + (s.num_non_finite || 0), 0);
    document.getElementById("curve-status").textContent = total ?
      `${fmt.format(total)} points recorded in ${Object.keys(series).length} series; ${fmt.format(shown)} drawn` +
      (shown < total ? " (downsampled with MinMaxLTTB: zoom in for full resolution)" : "") + "." +
      (nonFinite ? ` ${fmt.format(nonFinite)} NaN or infinite values are not drawn (they are in the exports).` : "") +
      (refused ? ` ${fmt.format(refused)} points were refused: their step was not after the series' last.` : "") : "";
  }

  async function fetchSeries(params, channel, anyUrl = false) {
    // With a channel: null when the answer has not changed since its last one (a 304; see liveJson's anyUrl).
    const body = await window.liveJson(channel && "curves-" + channel, metricsUrl + "?" + new URLSearchParams(params),
      {anyUrl});
    return body && body.series;
  }

  function thin(s) {
    // A live series grows by every poll: past 2 x POINTS it is cut back to about POINTS, keeping the first and
    // last point and the lowest and highest of each of POINTS / 2 equal step spans (MinMax, the first half of
    // the server's MinMaxLTTB), so every spike the chart showed stays drawn and the density stays even in steps.
    const n = s.steps.length;
    if (n <= 2 * POINTS) return;
    const first = s.steps[0], span = (s.steps[n - 1] - first + 1) / (POINTS / 2);
    const keep = [0];
    let lo = 1;
    while (lo < n - 1) {
      const bucket = Math.floor((s.steps[lo] - first) / span);
      let hi = lo, min = lo, max = lo;
      while (hi + 1 < n - 1 && Math.floor((s.steps[hi + 1] - first) / span) === bucket) {
        hi += 1;
        if (s.values[hi] < s.values[min]) min = hi;
        if (s.values[hi] > s.values[max]) max = hi;
      }
      keep.push(...(min === max ? [min] : [Math.min(min, max), Math.max(min, max)]));
      lo = hi + 1;
    }
    keep.push(n - 1);
    for (const col of COLUMNS) s[col] = keep.map((i) => s[col][i]);
  }

  function merge(have, s) {
    // The answer's points after the last one held, then its summary (a window's points are all after its start).
    const last = have.steps.length ? have.steps[have.steps.length - 1] : -1;
    const from = s.steps.findIndex((step) => step > last);
    if (from >= 0) for (const col of COLUMNS) have[col] = have[col].concat(s[col].slice(from));
    for (const field of SUMMARY) have[field] = s[field];
    thin(have);
  }

  async function loadAll() {
    const all = await fetchSeries({points: POINTS}, "all");
    if (!all) return;  // no point since the last whole read, so none since the polls either
    for (const s of all) series[sid(s)] = s;
    drawAll();
    // When the charts were first drawn, in ms since navigation began (read by bench/tracker/metrics.py).
    if (!root.dataset.drawnAt && Object.keys(series).length) root.dataset.drawnAt = String(Math.round(performance.now()));
  }

  async function zoomed(family, ev) {
    const chart = charts[family];
    if (ev["xaxis.autorange"]) {
      chart.zoomed = false;
    } else if (ev["xaxis.range[0]"] !== undefined && opts.x === "step") {
      chart.zoomed = [Math.max(0, Math.floor(ev["xaxis.range[0]"])), Math.ceil(ev["xaxis.range[1]"])];
    } else {
      return;
    }
    const keys = [...new Set(chart.ids.map((id) => series[id].key))].join(",");
    const params = {keys, points: POINTS};
    if (chart.zoomed) Object.assign(params, {start: chart.zoomed[0], end: chart.zoomed[1]});
    const fresh = await fetchSeries(params);
    const view = {};
    for (const s of fresh) view[sid(s)] = s;
    // The window's answer is drawn as it is; it never joins the live series (it would be drawn and counted twice).
    Plotly.react(chart.div, traces(chart.ids.filter((id) => view[id]), view),
      {...layout(family, chart), xaxis: {...layout(family, chart).xaxis, ...(chart.zoomed ? {range: chart.zoomed} : {autorange: true})}},
      {displaylogo: false, responsive: true});
  }

  async function pollNew() {
    // Only the steps after the newest one held: every viewer that holds the same asks the same (one cached answer),
    // and sends back its last answer's ETag, so while no point arrived it gets a 304 (runs.tracking.curve_api).
    // With run_detail.js on the page, the run's status comes in the same request (runs.api.views.run_poll): one
    // poll instead of two, its 304 meaning neither moved. True when it brought news (points or a status).
    const start = Math.max(...Object.values(series).map((s) => s.last_step ?? -1)) + 1;
    const status = window.runStatus;
    let fresh;
    if (status) {
      status.carried = true;
      let answer;
      try {
        answer = await window.liveJson("run-poll", status.url({curves_start: start}), {anyUrl: true});
      } catch (err) {
        status.lost(err);
        throw err;
      }
      status.took(answer && answer.status);
      if (!answer) return false;
      fresh = answer.curves.series;
    } else {
      fresh = await fetchSeries({start, points: POINTS}, "poll", true);
      if (!fresh) return false;
    }
    const changed = new Set();
    for (let s of fresh) {
      const id = sid(s), have = series[id];
      // A series that took points before `start` (a validation at a step the training already passed, a new
      // series): its count says so, and it alone is asked again from its own last step.
      const missed = s.num_points - (have ? have.num_points : 0) - s.points_in_window;
      if (missed > 0) {
        const from = have && have.last_step != null ? have.last_step + 1 : 0;
        s = (await fetchSeries({keys: s.key, split: s.split, start: from, points: POINTS}))[0] || s;
      }
      if (!have) series[id] = {...s};
      else if (s.last_step !== have.last_step || s.num_points !== have.num_points) merge(have, s);
      else continue;
      changed.add(familyOf(s.key));
    }
    if (changed.size) drawAll(changed);
    return changed.size > 0 || !!status;
  }

  async function poll() {
    try {
      if (!Object.keys(series).length) {
        await loadAll();
      } else if (await pollNew()) {
        // Points came: poll about twice as often as they arrive (not under MIN_POLL_MS).
        const now = performance.now();
        if (lastNewsAt) pollMs = Math.min(MAX_POLL_MS, Math.max(MIN_POLL_MS, (now - lastNewsAt) / 2));
        lastNewsAt = now;
      } else {
        pollMs = Math.min(MAX_POLL_MS, pollMs * 1.5);  // nothing new: wait longer
      }
    } catch (err) {
      document.getElementById("curve-status").textContent = "Lost contact with the server (" + err + "); retrying.";
    }
    if (!runFinished) setTimeout(poll, pollMs);
    else if (!root.dataset.finalLoaded) { root.dataset.finalLoaded = "1"; await loadAll(); }
  }

  // System: what the workers sampled while they ran this run's stages (split "system", a point's step is its
  // time in ms: runs.tracking.system_series), always against wall time, with polls of their own.
  const sysRoot = document.getElementById("system-charts");
  const SYSTEM_CHARTS = [
    ["cpu", "CPU (%, 100 = one core)", /^system\/(host_)?cpu_percent$/],
    ["memory", "Memory", /^system\/(rss_bytes|host_memory_used_bytes)$/],
    ["gpu_util", "GPU utilisation (%)", /^system\/gpu\d+_util_percent$/],
    ["gpu_memory", "GPU memory", /^system\/gpu\d+_memory_used_bytes$/],
    ["disk", "Disk (bytes/s)", /^system\/disk_(read|write)_bytes_per_s$/],
  ];
  const SYSTEM_NAMES = {cpu_percent: "the stage's processes", host_cpu_percent: "the host",
    rss_bytes: "the stage's processes (RSS)", host_memory_used_bytes: "the host (used)",
    disk_read_bytes_per_s: "read", disk_write_bytes_per_s: "written"};
  const sysSeries = {};
  let sysRefresh = 0;

  function systemName(key) {
    const short = key.slice("system/".length), gpu = short.match(/^gpu(\d+)_/);
    return SYSTEM_NAMES[short] || (gpu ? "GPU " + gpu[1] : short);
  }

  function drawSystem() {
    const charts = [];
    for (const [family, title, pattern] of SYSTEM_CHARTS) {
      const ids = Object.keys(sysSeries).filter((k) => pattern.test(k) && sysSeries[k].steps.length).sort();
      if (!ids.length) continue;
      let div = document.getElementById("plot-system-" + family);
      if (!div) div = dom.el("div", {id: "plot-system-" + family, class: "plot", dataset: {family}});
      charts.push([div, title, ids]);
    }
    // In the page before plotly draws them: a chart drawn outside the document takes plotly's default width
    // (700 px plus its legend), not its column's, and widened the page until the window was resized.
    const boxes = charts.map(([div]) => div);
    const plots = document.getElementById("system-plots");
    if (boxes.length && boxes.some((b, i) => plots.children[i] !== b)) plots.replaceChildren(...boxes);
    for (const [div, title, ids] of charts) {
      const data = ids.map((k, i) => {
        const s = sysSeries[k], name = dom.plotlyText(systemName(k));
        return {x: s.times.map((t) => new Date(t * 1000)), y: s.values, name, type: "scatter", mode: "lines",
          line: {color: PALETTE[i % PALETTE.length]}, hovertemplate: `${name}<br>%{x}: %{y:.4s}<extra></extra>`};
      });
      Plotly.react(div, data, {title: {text: title}, height: 280, margin: {l: 60, r: 125, t: 40, b: 40},
        xaxis: {title: {text: "wall time"}, type: "date"}, yaxis: {rangemode: "tozero", exponentformat: "SI"},
        legend: {orientation: "v", x: 1.02, xanchor: "left", y: 1, yanchor: "top", font: {size: 10}}},
        {displaylogo: false, responsive: true});
    }
    sysRoot.dataset.points = String(Object.values(sysSeries).reduce((n, s) => n + s.steps.length, 0));
    document.getElementById("system-status").hidden = boxes.length > 0;
  }

  async function pollSystem() {
    try {
      const whole = !Object.keys(sysSeries).length || Date.now() - sysRefresh > 60000;
      const params = {split: "system", points: POINTS};
      if (!whole) params.start = Math.min(...Object.values(sysSeries).map((s) => s.last_step ?? -1)) + 1;
      const body = await window.liveJson("system-" + (whole ? "all" : "poll"), metricsUrl + "?" + new URLSearchParams(params));
      if (whole) sysRefresh = Date.now();
      for (const s of (body && body.series) || []) {
        const have = sysSeries[s.key];
        if (whole || !have) { sysSeries[s.key] = s; continue; }
        const from = s.steps.findIndex((step) => step > (have.steps.length ? have.steps[have.steps.length - 1] : -1));
        if (from < 0) continue;
        for (const col of ["steps", "values", "times"]) have[col] = have[col].concat(s[col].slice(from));
        have.last_step = s.last_step;
      }
      if (body) drawSystem();
    } catch (err) {
      const status = document.getElementById("system-status");
      status.textContent = "Lost contact with the server (" + err + "); retrying.";
      status.hidden = false;
    }
    if (!runFinished) setTimeout(pollSystem, 5000);
    else if (!sysRoot.dataset.finalLoaded) { sysRoot.dataset.finalLoaded = "1"; sysRefresh = 0; await pollSystem(); }
  }

  document.addEventListener("run-summary", (ev) => { runFinished = !!ev.detail.finished; });
  for (const [id, key] of [["curve-smooth", "smooth"], ["curve-log", "log"], ["curve-x", "x"]]) {
    const input = document.getElementById(id);
    input.addEventListener("input", () => {
      opts[key] = input.type === "checkbox" ? input.checked : input.type === "range" ? Number(input.value) : input.value;
      if (key === "smooth") document.getElementById("curve-smooth-value").textContent = opts.smooth.toFixed(2);
      for (const f of Object.keys(charts)) { charts[f].zoomed = false; draw(f); }
    });
  }
  poll();
  if (sysRoot) pollSystem();
})();
