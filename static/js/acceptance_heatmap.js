// Compare page: the acceptance per draft position of each run (the table #acceptance-heatmap, drawn by
// the server against the first measured run) against the baseline run the select names. Every cell's
// delta text and colour, for every baseline, come from the server (runs.tracking.comparison.
// acceptance_side_by_side, in the json_script #acceptance-deltas): this script only swaps them in, as
// text (textContent), never as HTML.
(function () {
  "use strict";
  const select = document.getElementById("acceptance-baseline");
  const table = document.getElementById("acceptance-heatmap");
  const source = document.getElementById("acceptance-deltas");
  if (!select || !table || !source) return;
  const deltas = JSON.parse(source.textContent);  // {baseline run id: {run id: [[text, tone], ...]}}

  function show(baseline) {
    const byRun = deltas[baseline];
    if (!byRun) return;
    for (const row of table.querySelectorAll("tbody tr[data-run]")) {
      row.classList.toggle("baseline", row.dataset.run === baseline);
      const cells = byRun[row.dataset.run];
      if (!cells) continue;  // a run without a measurement: its row says why
      for (const cell of row.querySelectorAll("td[data-position]")) {
        const shown = cells[Number(cell.dataset.position) - 1];
        if (!shown) continue;
        const [text, tone] = shown;
        cell.className = "acc acc-" + tone;
        const delta = cell.querySelector(".acc-delta");
        if (delta) delta.textContent = text;
      }
    }
    const name = document.getElementById("acceptance-baseline-name");
    if (name && select.selectedOptions.length) name.textContent = select.selectedOptions[0].textContent;
    table.dataset.baseline = baseline;
  }

  select.addEventListener("change", () => show(select.value));
  show(select.value);  // a reload may keep another choice than the server's default
})();
