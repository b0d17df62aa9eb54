// The per-position acceptance bar chart, shared by the run page and the checkpoint page.
window.drawAcceptance = function (id, perPosition) {
  "use strict";
  Plotly.newPlot(id, [{type: "bar", x: perPosition.map((_, i) => "draft token " + (i + 1)), y: perPosition,
    text: perPosition.map((p) => (100 * p).toFixed(1) + " %"), textposition: "auto",
    hovertemplate: "%{x}: accepted in %{y:.1%} of verification steps<extra></extra>"}],
    {height: 240, margin: {l: 50, r: 10, t: 30, b: 40}, title: {text: "Acceptance per draft position"},
     yaxis: {range: [0, 1], tickformat: ".0%"}}, {displaylogo: false, responsive: true});
};
(function () {
  "use strict";
  const el = document.getElementById("plot-acceptance");
  if (el && el.dataset.acceptance) window.drawAcceptance(el.id, JSON.parse(el.dataset.acceptance));
})();
