// Draws the length histogram whose {edges, counts} sit in the #length-histogram JSON script tag.
(function () {
  "use strict";
  const node = document.getElementById("length-histogram");
  const target = document.getElementById("plot-lengths");
  if (!node || !target) return;
  const h = JSON.parse(node.textContent);
  const centers = h.counts.map((_, i) => (h.edges[i] + h.edges[i + 1]) / 2);
  const widths = h.counts.map((_, i) => h.edges[i + 1] - h.edges[i]);
  Plotly.newPlot(target, [{type: "bar", x: centers, y: h.counts, width: widths,
    hovertemplate: "%{x:.0f} tokens: %{y} rows<extra></extra>"}],
    {height: 260, margin: {l: 50, r: 10, t: 10, b: 40}, xaxis: {title: {text: "tokens per row"}}, yaxis: {title: {text: "rows"}}},
    {displaylogo: false, responsive: true});
})();
