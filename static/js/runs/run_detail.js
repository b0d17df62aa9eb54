// Live parts of the run page: stage states and training curves, polled from the JSON API.
(function () {
  "use strict";
  const table = document.getElementById("stages");
  const statusUrl = table.dataset.statusUrl;
  const fmt = new Intl.NumberFormat("en-US");
  let finished = false;

  const el = window.dom.el;

  function renderActions(summary) {
    // The header's remedies as the run's failure asks (templates/runs/pipeline/run_detail.html draws them on
    // load): a run that fails while its page is open offers Retry or Copy with changes without a reload.
    const retry = document.getElementById("retry-form");
    const copy = document.getElementById("copy-with-changes");
    if (!retry || !copy) return;  // a run trained elsewhere has neither
    const ended = summary.status === "failed" || summary.status === "cancelled";
    const failure = summary.failure;
    retry.hidden = !ended || Boolean(failure && !failure.retryable);
    copy.hidden = !ended || !failure || (failure.retryable && !failure.field);
    copy.href = copy.dataset.copyUrl + (failure && failure.field ? "&change=" + encodeURIComponent(failure.field) : "");
    const shown = document.getElementById("run-failure");
    if (!failure) {
      if (shown) shown.remove();
      return;
    }
    const hint = failure.retryable ? ["Retry is offered: " + failure.why + "."]
      : ["No Retry: " + failure.why, failure.field ? [" (change ", el("code", {}, failure.field), ")"] : [], "."];
    const note = el("p", {class: "message error", id: "run-failure", "data-kind": failure.kind, "data-field": failure.field},
      failure.error + " ", el("span", {class: "hint"}, hint));
    if (shown) shown.replaceWith(note);
    else document.querySelector(".header-row").after(note);
  }

  function renderStages(summary) {
    const cancel = document.getElementById("cancel-form");
    if (cancel && summary.finished) cancel.remove();
    renderActions(summary);
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
      list.replaceChildren(...warnings.map((w) => el("li", {}, w)));
      const error = detail.querySelector('[data-field="error"]');
      error.textContent = stage.error;
      error.hidden = !stage.error;
      error.className = stage.status === "failed" ? "error" : "note";  // a cancel is the user's, not a fault
      const details = detail.querySelector('[data-field="error-detail"]');  // where it stopped, for developers
      if (details) {
        details.hidden = !stage.error_detail;
        details.querySelector("pre").textContent = stage.error_detail || "";
      }
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
      const kept = split.held_out_duplicates_removed;  // absent from splits recorded before content was compared
      if (kept != null) {
        const unit = split.by === "row" ? "row" : "conversation";
        setToken("split_duplicates", fmt.format(kept) + " " + unit + (kept === 1 ? "" : "s") +
          " whose prompt context also occurs in another " + unit + " (they train)");
      }
    }
    if (train.loss_tokens_available != null) {
      setToken("loss_tokens_trained", fmt.format(train.loss_tokens_trained) + " / " + fmt.format(train.loss_tokens_available));
      setToken("tokens_per_step", fmt.format(train.tokens_per_step));
    }
    renderTimeline(summary.stages);
    renderCheckpoints(summary.checkpoints, summary.best, window.location.pathname);
    renderAcceptance(summary.acceptance);
    renderAttempts(summary.attempts);
    renderGlance(summary.glance);
  }

  function renderGlance(g) {
    // The header (templates/runs/pipeline/_glance.html) from the summary's `glance` (runs.pipeline.status.glance).
    if (!g) return;
    const set = (key, text) => { const el = document.querySelector(`[data-glance="${key}"]`); if (el) el.textContent = text; };
    const list = (values) => (values && values.length ? values.map((v) => (v == null ? "–" : v.toFixed(3))).join(" · ") : null);
    set("stage", g.stage_label);
    const status = document.querySelector('[data-glance="stage_status"]');
    if (status) { status.textContent = g.stage_status; status.className = "status " + g.stage_status; }
    set("progress", g.progress_total ? fmt.format(g.progress_done) + " / " + fmt.format(g.progress_total) : "–");
    set("eta", g.eta_seconds == null ? "–" : Math.round(g.eta_seconds) + " s");
    // The run's end, with what it assumes or why it cannot be said (runs.pipeline.status.glance.run_eta).
    set("run_eta", g.run_eta_seconds == null ? "–" : Math.round(g.run_eta_seconds) + " s");
    set("run_eta_note", "(" + g.run_eta_note + ")");
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
    const rows = attempts.map((a) => el("tr", {"data-attempt": `${a.stage}-${a.number}`},
      el("td", {}, a.stage), el("td", {}, String(a.number)),
      el("td", {}, el("span", {class: "status " + a.outcome}, a.outcome)),
      el("td", {title: a.started_at}, new Date(a.started_at).toLocaleString()),
      el("td", {}, a.seconds.toFixed(1) + " s"), el("td", {}, a.worker),
      el("td", {}, a.error ? el("p", {class: "error"}, a.error.slice(0, 2000)) : null,
        a.log_tail ? el("details", {}, el("summary", {}, "Log"), el("pre", {class: "log"}, a.log_tail)) : null)));
    document.getElementById("attempts").replaceChildren(el("table", {class: "list", id: "attempt-table"},
      headRow(["Stage", "#", "Outcome", "Started", "Duration", "Worker", "Error and log"]), el("tbody", {}, rows)));
  }

  function headRow(titles) {
    return el("thead", {}, el("tr", {}, titles.map((t) => el("th", {}, t))));
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
    cell("prompts").textContent = a.num_prompts + " prompts, " + fmt.format(a.new_tokens) + " tokens" +
      (a.tau_standard_error != null ? "; τ's standard error over them " + a.tau_standard_error.toFixed(3) : "");
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

  function renderCheckpoints(checkpoints, best, runUrl) {
    // The same columns as the page's own table (templates/runs/checkpoints/_checkpoints.html): a poll's rendering replaces it.
    if (!checkpoints.length) return;
    const num = (v, digits) => (v == null ? "–" : v.toFixed(digits));
    const provisional = best && best.provisional ? " (provisional)" : "";
    const rows = checkpoints.map((c) => el("tr", {class: c.is_best ? "best" : ""},
      el("td", {}, String(c.epoch + 1), c.is_best ? [" ", el("span", {class: "badge"}, "best" + provisional)] : null,
        c.unusable_why ? el("div", {class: "field-error unusable"}, el("strong", {}, "Do not deploy:"), " " + c.unusable_why) : null),
      el("td", {}, num(c.val_loss, 4)), el("td", {}, num(c.train_loss, 4)),
      el("td", {}, num(c.tau, 2), Object.entries(c.tau_by_suite || {}).filter(([name]) => name !== "held_out").flatMap(([name, tau]) => [el("br", {}),
        el("span", {class: "hint suite-tau", "data-suite": name, title: "τ on the evaluation suite " + name},
          name + " " + num(tau, 2))])),
      el("td", {}, num(c.simulated_tau, 2)),
      el("td", {}, el("code", {}, c.path), " ", el("a", {href: c.url}, "details, review, measure")),
      el("td", {class: "recommended-k"}, c.recommended_k == null ? "–" : String(c.recommended_k)),
      el("td", {}, el("code", {class: "copy"}, c.serve_command)),
      // No token of its own, as on the page's table: static/js/runs/checkpoint_export.js adds the page's on submit.
      el("td", {}, c.path ? el("form", {method: "post", class: "export-checkpoint", action: `/checkpoints/${c.id}/export/`},
        el("input", {type: "hidden", name: "next", value: runUrl}),
        el("button", {type: "submit", title: "a new folder under the runs folder's exports/ with config.json, the weights and a README.md model card"}, "Export")) : null)));
    document.getElementById("checkpoints").replaceChildren(el("table", {class: "list", id: "checkpoint-table"},
      headRow(["Epoch", "Val loss", "Train loss", "τ measured", "τ simulated", "Path", "k to serve", "Serve with vLLM", "Deploy"]),
      el("tbody", {}, rows)));
  }

  // The last summary drawn, and when it came. The page brings the summary as of the run's state, so the first
  // poll asks for what moved since (the live part) instead of the whole summary again.
  const embedded = document.getElementById("run-summary-data");
  let shown = embedded ? JSON.parse(embedded.textContent) : null, shownAt = Date.now();
  function tickRunning() {
    // Nothing changed (304): only a running stage's duration moves, counted on from the last summary.
    for (const stage of shown ? shown.stages : []) {
      if (stage.status !== "running" || stage.seconds == null) continue;
      const cell = table.querySelector(`tr[data-stage="${stage.name}"] [data-field="seconds"]`);
      if (cell) cell.textContent = (stage.seconds + (Date.now() - shownAt) / 1000).toFixed(1) + " s";
    }
  }

  function withLivePart(live) {
    // A live part (runs.pipeline.status.live_summary): the running stages' duration, progress and log, the
    // header's moving figures; the rest of the summary held stays as it is until the run's state moves.
    for (const part of live.stages) {
      const stage = shown.stages.find((s) => s.name === part.name);
      if (!stage) continue;
      Object.assign(stage, part);
      stage.progress = part.progress_total ? Math.min(1, part.progress_done / part.progress_total) : 0;
    }
    Object.assign(shown.glance, live.glance);
    return shown;
  }

  function pollUrl(params = {}) {
    // Holding a whole summary: ask for what moved since its state (the whole summary again once that moved).
    const url = new URL(statusUrl, window.location.href);
    if (shown) url.searchParams.set("since", shown.state_version);
    for (const [name, value] of Object.entries(params)) url.searchParams.set(name, value);
    return url.pathname + url.search;
  }

  function took(answer) {
    // A status answer: null when unchanged (a 304), the live part, or the whole summary.
    const summary = answer && answer.live ? withLivePart(answer) : answer;
    if (summary) {
      renderStages(summary);
      document.dispatchEvent(new CustomEvent("run-summary", {detail: summary}));  // curves.js stops with the run
      finished = summary.finished;
      shown = summary;
      shownAt = Date.now();
    } else {
      tickRunning();
    }
  }

  function lost(err) {
    document.getElementById("run-status").title = "Lost contact with the server (" + err + "); retrying.";
  }

  // While the run trains, curves.js's one poll brings the status too (runs.api.views.run_poll: one request where
  // there were two): it asks pollUrl with its own parameters, hands the status here, and sets `carried`; this
  // loop then asks nothing and only counts a running stage's duration on. Until then (no curve yet) it asks for
  // the status alone.
  window.runStatus = {url: pollUrl, took, lost, carried: false};

  async function poll() {
    if (window.runStatus.carried) {
      tickRunning();
    } else {
      try {
        took(await window.liveJson("status", pollUrl()));  // null: unchanged (static/js/shared/live_fetch.js)
      } catch (err) {
        lost(err);
      }
    }
    if (!finished) setTimeout(poll, 2000);
  }
  poll();
})();
