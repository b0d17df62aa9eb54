// Validation loss against measured τ, one point per checkpoint: on the run page (its checkpoints, with the
// best by τ and the lowest validation loss marked, and the sentence saying which is the run's best), and
// on the compare page (every checkpoint of the compared runs, a colour per run). The τ plotted is the one
// the best is chosen by (runs.pipeline.best): ours, measured alike on every checkpoint; vLLM's, where a
// serve check ran, is named beside it in the label.
// Data reaches the page as text: numbers and names go through dom.plotlyText, never through innerHTML.
(function () {
  "use strict";
  // On the compare page a run has the colour its id gives it there (window.runColour, static/js/compare/compare.js).
  const LAYOUT = {height: 340, margin: {l: 60, r: 20, t: 20, b: 50},
    xaxis: {title: {text: "validation loss"}}, yaxis: {title: {text: "τ measured (tokens per target forward)"}},
    legend: {orientation: "h", y: -0.25}};

  // The checkpoints a summary (run_pipeline --json) holds that have both figures.
  function measured(summary) {
    return (summary.checkpoints || []).filter((c) => c.tau_for_best != null && c.val_loss != null);
  }

  function hover(prefix, c) {
    const vllm = c.vllm_tau != null ? `; vLLM's ${c.vllm_tau.toFixed(3)}` : "";
    return dom.plotlyText(`${prefix}epoch ${c.epoch + 1}: validation loss ${c.val_loss.toFixed(4)}, τ ${c.tau_for_best.toFixed(3)}${vllm}`);
  }

  function trace(name, points, marker, prefix) {
    return {type: "scatter", mode: "markers", name: dom.plotlyText(name), marker,
      x: points.map((c) => c.val_loss), y: points.map((c) => c.tau_for_best),
      text: points.map((c) => hover(prefix || "", c)), hovertemplate: "%{text}<extra></extra>"};
  }

  function draw(div, traces) {
    if (!div.dataset.drawn) div.replaceChildren();  // the "nothing measured yet" note goes
    div.dataset.drawn = "1";
    Plotly.react(div, traces, LAYOUT, {displaylogo: false, responsive: true});
  }

  // --- the run page ---------------------------------------------------------------------------------
  let runKey = null;
  function runPage(summary) {
    const best = summary.best || {};
    const line = document.getElementById("best-choice");
    if (line) {
      line.textContent = best.text || "";
      line.hidden = !best.text;
      line.className = best.provisional ? "hint provisional" : "";
    }
    const note = document.getElementById("best-vllm-note");
    if (note) {
      note.textContent = best.vllm_note || "";
      note.hidden = !best.vllm_note;
    }
    // run_detail.js draws the table with a plain "best" badge; until τ decides, the mark is provisional.
    for (const badge of document.querySelectorAll("#checkpoint-table tr.best .badge")) {
      badge.textContent = best.provisional ? "best (provisional)" : "best";
    }
    const div = document.getElementById("plot-loss-tau");
    const points = measured(summary);
    const key = JSON.stringify([points.map((c) => [c.id, c.val_loss, c.tau_for_best, c.vllm_tau]),
      best.by_tau && best.by_tau.checkpoint_id, best.by_val_loss && best.by_val_loss.checkpoint_id]);
    if (!div || !points.length || key === runKey) return;
    runKey = key;
    const marked = (choice) => points.filter((c) => choice && c.id === choice.checkpoint_id);
    draw(div, [
      trace("checkpoints", points, {size: 9, color: "#1f77b4"}),
      trace("best by τ", marked(best.by_tau), {size: 16, symbol: "star", color: "#2e7d32"}, "best by τ: "),
      trace("lowest validation loss", marked(best.by_val_loss), {size: 14, symbol: "diamond-open", color: "#c62828",
        line: {width: 2}}, "lowest validation loss: "),
    ]);
  }
  if (document.getElementById("plot-loss-tau")) {
    // run_detail.js sends each summary it polled, after drawing the page from it.
    document.addEventListener("run-summary", (ev) => runPage(ev.detail));
  }

  // --- the compare page -----------------------------------------------------------------------------
  async function comparePage(div, list) {
    const runs = [...list.querySelectorAll("li")].map((li) => ({id: li.dataset.run, name: li.dataset.name, url: li.dataset.url}));
    const summaries = await Promise.all(runs.map(async (run) => {
      const resp = await fetch(run.url, {headers: {Accept: "application/json"}});
      return resp.ok ? resp.json() : null;
    }));
    const traces = [];
    summaries.forEach((summary, i) => {
      const points = summary ? measured(summary) : [];
      if (points.length) {
        traces.push(trace(runs[i].name, points, {size: 10, color: window.runColour(runs[i].id)}, runs[i].name + ", "));
      }
    });
    if (!traces.length) {
      div.textContent = "None of these runs has a measured checkpoint yet.";
      return;
    }
    draw(div, traces);
  }
  const compareDiv = document.getElementById("compare-loss-tau");
  const compareRuns = document.getElementById("compare-loss-tau-runs");
  if (compareDiv && compareRuns) {
    comparePage(compareDiv, compareRuns).catch((err) => {
      compareDiv.textContent = "Could not read the runs' checkpoints (" + err + ").";
    });
  }
})();
