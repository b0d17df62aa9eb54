// Compare page: each metric family in one chart, every run's series overlaid (a colour per run,
// validation dashed), at most 1,000 points per series (MinMaxLTTB on the server).
(function () {
  "use strict";
  const root = document.getElementById("compare-plots");
  if (!root) return;
  const runs = JSON.parse(document.getElementById("compare-chart-runs").textContent);
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const familyOf = (key) => key.replace(/_\d+$/, "");

  async function load() {
    const families = {};
    await Promise.all(runs.map(async (run, i) => {
      const resp = await fetch(run.url + "?points=1000", {headers: {Accept: "application/json"}});
      for (const s of (await resp.json()).series) {
        const f = familyOf(s.key);
        (families[f] = families[f] || []).push({
          x: s.steps, y: s.values, name: `${run.name}: ${s.split} ${s.key}`, legendgroup: String(run.id),
          type: s.split === "val" ? "scatter" : "scattergl", mode: s.split === "val" ? "lines+markers" : "lines",
          line: {color: PALETTE[i % PALETTE.length], dash: s.split === "val" ? "dash" : "solid", width: 1.5},
        });
      }
    }));
    for (const family of Object.keys(families).sort()) {
      const div = document.createElement("div");
      div.className = "plot";
      div.id = "compare-" + family;
      root.appendChild(div);
      Plotly.newPlot(div, families[family], {title: {text: family}, height: 340, margin: {l: 60, r: 10, t: 40, b: 40},
        xaxis: {title: {text: "step"}}, legend: {orientation: "h", y: -0.25}}, {displaylogo: false, responsive: true});
    }
  }
  load();
})();
