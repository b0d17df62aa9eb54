// A report's live blocks (templates/runs/reports/report_block.html, specs in #report-blocks from
// runs.reports.rendering): each chart fetches its runs' series from /api/v1/runs/<id>/metrics/ and draws
// them with plotly, a colour per run and a line style per series, as compare.js does; each generations
// block asks /api/v1/checkpoints/<id>/generations/ and says "not available" where that answers 404 or
// fails. Tables and error blocks are the server's. Every string from data goes in as text (dom.el) or
// through dom.plotlyText.
(function () {
  "use strict";
  const specs = document.getElementById("report-blocks");
  if (!specs) return;
  const blocks = JSON.parse(specs.textContent);
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"];
  const POINTS = 1000;

  function note(figure, text) {
    figure.append(dom.el("p", {class: "hint report-chart-note"}, text));
  }

  async function drawChart(block) {
    const div = document.getElementById("report-chart-" + block.index);
    if (!div) return;
    const figure = div.closest("figure");
    const traces = [];
    await Promise.all(block.runs.map(async (run) => {
      if (!run.series.length) return;
      const keys = [...new Set(run.series.map((s) => s.split(":")[1]))];
      const query = new URLSearchParams({keys: keys.join(","), points: String(POINTS)});
      if (block.split) query.set("split", block.split);
      let answer;
      try {
        const resp = await fetch(run.metrics_url + "?" + query, {headers: {Accept: "application/json"}, credentials: "same-origin"});
        if (!resp.ok) throw new Error("HTTP " + resp.status);
        answer = await resp.json();
      } catch (err) {
        note(figure, `The curves of ${run.name} could not be read (${err.message}).`);
        return;
      }
      answer.series.forEach((s, i) => {
        const val = s.split === "val";
        traces.push({order: [run.colour, s.key, s.split], x: s.steps, y: s.values, type: "scatter",
          mode: val ? "lines+markers" : "lines", name: dom.plotlyText(`${run.name}: ${s.split} ${s.key}`),
          legendgroup: String(run.id), line: {color: PALETTE[run.colour % PALETTE.length], dash: DASHES[i % DASHES.length], width: 1.6},
          marker: {size: 5}});
      });
    }));
    if (!traces.length) {
      div.remove();
      note(figure, `No ${block.metric} points to draw yet.`);
      figure.dataset.drawn = "1";
      return;
    }
    // The same order whatever order the answers came in: by run as written, then key, then split.
    traces.sort((a, b) => (a.order[0] - b.order[0]) || a.order[1].localeCompare(b.order[1]) || a.order[2].localeCompare(b.order[2]));
    traces.forEach((t) => delete t.order);
    Plotly.newPlot(div, traces, {
      title: {text: dom.plotlyText(block.metric)}, height: 360, margin: {l: 60, r: 260, t: 40, b: 50},
      xaxis: {title: {text: "step"}},
      legend: {orientation: "v", x: 1.02, xanchor: "left", y: 1, yanchor: "top", font: {size: 10}},
    }, {displaylogo: false, responsive: true});
    figure.dataset.drawn = "1";
  }

  // A reply as the checkpoint page draws it (static/css/generations.css): a token coloured by the draft
  // position that proposed it, the target's own marked (prefill, correction after the struck-through draft
  // token it replaced, bonus), each verification forward's tokens in one outlined span.
  const shown = (text) => String(text).replace(/\n/g, "↵\n").replace(/\t/g, "→\t") || "∅";
  const tokenKind = (t) => t.proposed_at != null ? "pos-" + t.proposed_at : t.verify_step === 0 ? "prefill" : t.rejected ? "corrected" : "bonus";

  function reply(prompt) {
    const box = dom.el("div", {class: "reply"});
    let step = null, span = null;
    for (const t of prompt.tokens || []) {
      if (t.verify_step !== step || span === null) {
        step = t.verify_step;
        span = dom.el("span", {class: "step"});
        box.append(span);
      }
      if (t.rejected) span.append(dom.el("del", {class: "rejected"}, shown(t.rejected.text)));
      span.append(dom.el("span", {class: "tok " + tokenKind(t),
        title: t.proposed_at != null ? `draft position ${t.proposed_at}, accepted` : "the target's token"}, shown(t.text)));
    }
    return box;
  }

  async function showGenerations(block) {
    const section = document.querySelector(`.report-generations[data-block="${block.index}"]`);
    if (!section) return;
    const state = section.querySelector(".report-generations-state");
    const body = section.querySelector(".report-generations-body");
    let answer;
    try {
      const resp = await fetch(block.url, {headers: {Accept: "application/json"}, credentials: "same-origin"});
      if (resp.status === 404) {
        state.textContent = `Generations are not available for checkpoint ${block.checkpoint}: the server has none for it (or no generations API).`;
        section.dataset.state = "unavailable";
        return;
      }
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      answer = await resp.json();
    } catch (err) {
      state.textContent = `Generations of checkpoint ${block.checkpoint} are not available (${err.message}).`;
      section.dataset.state = "unavailable";
      return;
    }
    const prompts = (answer.prompts || []).slice(0, block.prompts);
    state.textContent = prompts.length
      ? `${prompts.length} of ${answer.prompts_total} prompts of ${answer.label}; a token's colour is the draft position that proposed it (hover one).`
      : `Checkpoint ${block.checkpoint} has no recorded generations: no measurement of it recorded its replies.`;
    for (const prompt of prompts) {
      body.append(dom.el("div", {class: "report-generation", dataset: {prompt: String(prompt.index)}},
        dom.el("p", {class: "prompt-tail"}, `prompt ${prompt.index + 1} (τ ${prompt.tau == null ? "–" : Number(prompt.tau).toFixed(2)}): `
          + (prompt.prompt_cut ? "…" : "") + (prompt.prompt_tail || "")),
        reply(prompt)));
    }
    section.dataset.state = "shown";
  }

  for (const block of blocks) {
    if (block.kind === "chart") drawChart(block);
    else if (block.kind === "generations") showGenerations(block);
  }
})();
