// Live parts of the run page: stage states and training curves, polled from the JSON API.
(function () {
  "use strict";
  const table = document.getElementById("stages");
  const statusUrl = table.dataset.statusUrl;
  const fmt = new Intl.NumberFormat("en-US");
  let finished = false;

  function esc(text) {
    const div = document.createElement("div");
    div.textContent = text == null ? "" : String(text);
    return div.innerHTML;
  }

  function renderStages(summary) {
    const cancel = document.getElementById("cancel-form");
    if (cancel && summary.finished) cancel.remove();
    renderHistogram(summary.tokens.length_histogram);
    document.getElementById("run-status").textContent = summary.status;
    document.getElementById("run-status").className = "status " + summary.status;
    for (const stage of summary.stages) {
      const row = table.querySelector(`tr[data-stage="${stage.name}"]`);
      const detail = table.querySelector(`tr[data-stage-detail="${stage.name}"]`);
      const status = row.querySelector('[data-field="status"]');
      status.textContent = stage.status;
      status.className = "status " + stage.status;
      row.querySelector('[data-field="bar"]').style.width = (100 * stage.progress).toFixed(1) + "%";
      row.querySelector('[data-field="progress"]').textContent =
        fmt.format(stage.progress_done) + " / " + fmt.format(stage.progress_total);
      row.querySelector('[data-field="seconds"]').textContent =
        stage.seconds == null ? "–" : stage.seconds.toFixed(1) + " s";
      row.querySelector('[data-field="worker"]').textContent = stage.worker;
      const badge = row.querySelector('[data-field="warn-badge"]');
      const warnings = stage.warnings || [];
      badge.hidden = !warnings.length;
      badge.textContent = warnings.length + (warnings.length === 1 ? " warning" : " warnings");
      const list = detail.querySelector('[data-field="warnings"]');
      list.hidden = !warnings.length;
      list.innerHTML = warnings.map((w) => "<li>" + esc(w) + "</li>").join("");
      const error = detail.querySelector('[data-field="error"]');
      error.textContent = stage.error;
      error.hidden = !stage.error;
      error.className = stage.status === "failed" ? "error" : "note";  // a cancel is the user's, not a fault
      detail.querySelector('[data-field="log"]').textContent = stage.log_tail;
      const note = detail.querySelector('[data-field="queue-note"]');
      if (note && stage.status !== "queued") note.hidden = true;  // a worker took it: the note was about waiting
    }
    const t = summary.tokens;
    for (const key of ["conversations", "rows", "total_tokens", "loss_tokens", "extracted_tokens"]) {
      const cell = document.querySelector(`[data-token="${key}"]`);
      if (cell && t[key] != null) cell.textContent = fmt.format(t[key]);
    }
    const cov = document.querySelector('[data-token="vocab_coverage"]');
    if (cov && t.vocab_coverage != null) cov.textContent = (100 * t.vocab_coverage).toFixed(1) + " %";
    const prep = summary.stages.find((s) => s.name === "prepare") || {};  // none: a run trained elsewhere
    const train = summary.stages.find((s) => s.name === "train");
    setToken("truncated_rows", prep.num_truncated_rows == null ? null : fmt.format(prep.num_truncated_rows));
    const split = train.split || {};
    if (split.by) {
      setToken("split_rows", fmt.format(split.train_rows) + " / " + fmt.format(split.val_rows));
      setToken("split_conversations", fmt.format(split.train_conversations) + " / " + fmt.format(split.val_conversations) +
        " (split by " + split.by + ", seed " + split.seed + ")");
    }
    if (train.loss_tokens_available != null) {
      setToken("loss_tokens_trained", fmt.format(train.loss_tokens_trained) + " / " + fmt.format(train.loss_tokens_available));
      setToken("tokens_per_step", fmt.format(train.tokens_per_step));
    }
    renderTimeline(summary.stages);
    renderCheckpoints(summary.checkpoints);
    renderAcceptance(summary.acceptance);
    renderAttempts(summary.attempts);
    renderGlance(summary.glance);
  }

  function renderGlance(g) {
    // The header (templates/runs/_glance.html) from the summary's `glance` (runs.pipeline.glance).
    if (!g) return;
    const set = (key, text) => { const el = document.querySelector(`[data-glance="${key}"]`); if (el) el.textContent = text; };
    const list = (values) => (values && values.length ? values.map((v) => (v == null ? "–" : v.toFixed(3))).join(" · ") : null);
    set("stage", g.stage_label);
    const status = document.querySelector('[data-glance="stage_status"]');
    if (status) { status.textContent = g.stage_status; status.className = "status " + g.stage_status; }
    set("progress", g.progress_total ? fmt.format(g.progress_done) + " / " + fmt.format(g.progress_total) : "–");
    set("eta", g.eta_seconds == null ? "–" : Math.round(g.eta_seconds) + " s");
    set("train_step", g.train_steps ? fmt.format(g.train_step || 0) + " of " + fmt.format(g.train_steps) : "–");
    set("reported_step", g.latest.step == null ? "–" : fmt.format(g.latest.step));  // a run trained elsewhere
    set("loss", list(g.latest.train.loss) || "–");
    const val = list(g.latest.val.full_acc);
    set("acc", val ? val + " (val)" : list(g.latest.train.full_acc) || "–");
    set("tau", g.best_tau == null ? "–" : g.best_tau.toFixed(2));
    const warnings = document.querySelector('[data-glance="warnings"]');
    if (warnings) { warnings.textContent = g.warnings; warnings.className = g.warnings ? "warning" : ""; }
  }

  function renderAttempts(attempts) {
    if (!attempts.length) return;
    const rows = attempts.map((a) => `<tr data-attempt="${esc(a.stage)}-${a.number}"><td>${esc(a.stage)}</td><td>${a.number}</td>` +
      `<td><span class="status ${esc(a.outcome)}">${esc(a.outcome)}</span></td>` +
      `<td title="${esc(a.started_at)}">${esc(new Date(a.started_at).toLocaleString())}</td>` +
      `<td>${a.seconds.toFixed(1)} s</td><td>${esc(a.worker)}</td>` +
      `<td>${a.error ? '<pre class="error">' + esc(a.error.slice(0, 2000)) + "</pre>" : ""}` +
      `${a.log_tail ? "<details><summary>Log</summary><pre class=\"log\">" + esc(a.log_tail) + "</pre></details>" : ""}</td></tr>`).join("");
    document.getElementById("attempts").innerHTML = '<table class="list" id="attempt-table"><thead><tr><th>Stage</th><th>#</th>' +
      "<th>Outcome</th><th>Started</th><th>Duration</th><th>Worker</th><th>Error and log</th></tr></thead><tbody>" + rows + "</tbody></table>";
  }

  function setToken(key, text) {
    const cell = document.querySelector(`[data-token="${key}"]`);
    if (cell && text != null) cell.textContent = text;
  }

  let acceptanceDrawn = false;
  function renderAcceptance(a) {
    const cell = (key) => document.querySelector(`[data-acc="${key}"]`);
    if (a.simulated_tau != null) cell("simulated_tau").textContent = a.simulated_tau.toFixed(2);
    if (a.tau == null || acceptanceDrawn) return;
    acceptanceDrawn = true;
    cell("tau").textContent = a.tau.toFixed(2);
    cell("output_matches_greedy").textContent = a.output_matches_greedy ? "yes (token for token)" : "NO";
    cell("num_speculative_tokens").textContent = a.num_speculative_tokens;
    cell("speeds").textContent = fmt.format(Math.round(a.spec_tokens_per_s)) + " / " +
      fmt.format(Math.round(a.greedy_tokens_per_s)) + " on " + a.device;
    cell("prompts").textContent = a.num_prompts + " prompts, " + fmt.format(a.new_tokens) + " tokens";
    const note = document.getElementById("speed-note");
    if (note) note.hidden = a.device !== "cpu";
    window.drawAcceptance("plot-acceptance", a.acceptance_per_position);
  }


  function renderTimeline(stages) {
    const started = stages.filter((s) => s.started_at);
    if (!started.length) return;
    const t0 = Math.min(...started.map((s) => Date.parse(s.started_at)));
    const data = [{
      type: "bar", orientation: "h",
      y: started.map((s) => s.label), x: started.map((s) => s.seconds || 0),
      base: started.map((s) => (Date.parse(s.started_at) - t0) / 1000),
      text: started.map((s) => (s.seconds || 0).toFixed(1) + " s"), textposition: "auto",
      marker: {color: started.map((s) => ({succeeded: "#2e7d32", failed: "#c62828", running: "#1565c0", cancelled: "#777"})[s.status] || "#999")},
      hovertemplate: "%{y}: %{x:.1f} s<extra></extra>",
    }];
    Plotly.react("timeline", data, {
      height: 180, margin: {l: 170, r: 20, t: 10, b: 35},
      xaxis: {title: {text: "seconds since the first stage started"}}, yaxis: {autorange: "reversed"},
    }, {displayModeBar: false, responsive: true});
  }

  let histogramDrawn = false;
  function renderHistogram(h) {
    if (histogramDrawn || !h || !h.counts || !h.counts.length) return;
    histogramDrawn = true;
    const centers = h.counts.map((_, i) => (h.edges[i] + h.edges[i + 1]) / 2);
    // The axis spans the lengths that occur, not the whole 0..max_seq_len the buckets were laid over.
    const used = h.counts.map((c, i) => (c ? i : -1)).filter((i) => i >= 0);
    const range = used.length ? [h.edges[used[0]], h.edges[used[used.length - 1] + 1]] : undefined;
    Plotly.newPlot("plot-lengths", [{type: "bar", x: centers, y: h.counts,
      width: h.counts.map((_, i) => h.edges[i + 1] - h.edges[i]),
      hovertemplate: "%{x:.0f} tokens: %{y} rows<extra></extra>"}],
      {height: 220, margin: {l: 45, r: 10, t: 10, b: 40}, xaxis: {title: {text: "tokens per row"}, range}, yaxis: {title: {text: "rows"}}},
      {displaylogo: false, responsive: true});
  }

  function renderCheckpoints(checkpoints) {
    if (!checkpoints.length) return;
    const num = (v, digits) => (v == null ? "–" : v.toFixed(digits));
    const rows = checkpoints.map((c) => `<tr class="${c.is_best ? "best" : ""}"><td>${c.epoch}${c.is_best ? ' <span class="badge">best</span>' : ""}</td>` +
      `<td>${num(c.val_loss, 4)}</td><td>${num(c.train_loss, 4)}</td><td>${num(c.tau, 2)}</td><td>${num(c.simulated_tau, 2)}</td>` +
      `<td><code>${esc(c.path)}</code> <a href="${esc(c.url)}">details, review, measure</a></td><td><code class="copy">${esc(c.serve_command)}</code></td></tr>`).join("");
    document.getElementById("checkpoints").innerHTML = '<table class="list" id="checkpoint-table"><thead><tr><th>Epoch</th><th>Val loss</th>' +
      "<th>Train loss</th><th>τ measured</th><th>τ simulated</th><th>Path</th><th>Serve with vLLM</th></tr></thead><tbody>" + rows + "</tbody></table>";
  }

  let shown = null, shownAt = 0;  // the last summary drawn, and when it came
  function tickRunning() {
    // Nothing changed (304): only a running stage's duration moves, counted on from the last summary.
    for (const stage of shown ? shown.stages : []) {
      if (stage.status !== "running" || stage.seconds == null) continue;
      const cell = table.querySelector(`tr[data-stage="${stage.name}"] [data-field="seconds"]`);
      if (cell) cell.textContent = (stage.seconds + (Date.now() - shownAt) / 1000).toFixed(1) + " s";
    }
  }

  async function poll() {
    try {
      const summary = await window.liveJson("status", statusUrl);  // null: unchanged (static/js/live_fetch.js)
      if (summary) {
        renderStages(summary);
        document.dispatchEvent(new CustomEvent("run-summary", {detail: summary}));  // curves.js stops with the run
        finished = summary.finished;
        shown = summary;
        shownAt = Date.now();
      } else {
        tickRunning();
      }
    } catch (err) {
      document.getElementById("run-status").title = "Lost contact with the server (" + err + "); retrying.";
    }
    if (!finished) setTimeout(poll, 2000);
  }
  poll();
})();
