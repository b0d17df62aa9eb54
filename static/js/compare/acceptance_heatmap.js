// Compare page: the acceptance per draft position of each run (the table #acceptance-heatmap, drawn by
// the server against the baseline the page was asked for) against the baseline run the select names.
// Another baseline's cells come from the API the table names (GET /api/v1/compare/acceptance/?ids=..&
// baseline=..., runs.tracking.comparison.acceptance_side_by_side: the server words every delta and picks
// its colour); this script swaps them in as text (textContent), never as HTML. Without this script the
// select's form asks the page again with ?baseline=.
(function () {
  "use strict";
  const select = document.getElementById("acceptance-baseline");
  const table = document.getElementById("acceptance-heatmap");
  const status = document.getElementById("acceptance-status");
  if (!select || !table || !table.dataset.api) return;
  let shown = select.value;  // the baseline the table shows now
  let asked = 0;  // answers to an older choice are dropped

  function swap(answer) {
    const rows = new Map(answer.rows.map((row) => [String(row.run_id), row]));
    for (const tr of table.querySelectorAll("tbody tr[data-run]")) {
      tr.classList.toggle("baseline", tr.dataset.run === String(answer.baseline));
      const row = rows.get(tr.dataset.run);
      if (!row || !row.measured) continue;  // a run without a measurement: its row says why
      for (const td of tr.querySelectorAll("td[data-position]")) {
        const cell = row.cells[Number(td.dataset.position) - 1];
        if (!cell) continue;
        td.className = "acc acc-" + cell.tone;
        // The value too: a run measured again since the page loaded has its delta from the new value.
        const value = td.querySelector(".acc-value");
        if (value) value.textContent = cell.text;
        const delta = td.querySelector(".acc-delta");
        if (delta) delta.textContent = cell.delta_text;
      }
    }
    document.getElementById("acceptance-baseline-name").textContent = answer.baseline_name;
    table.dataset.baseline = String(answer.baseline);
    shown = String(answer.baseline);
    const url = new URL(window.location.href);  // a reload or a shared link keeps the choice
    url.searchParams.set("baseline", shown);
    window.history.replaceState(null, "", url);
  }

  async function show(baseline) {
    const mine = ++asked;
    status.textContent = "Loading the deltas…";
    try {
      const response = await fetch(table.dataset.api + "&baseline=" + encodeURIComponent(baseline),
                                   {headers: {Accept: "application/json"}, credentials: "same-origin"});
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(answer.error || "the server answered " + response.status);
      if (mine !== asked) return;
      swap(answer);
      status.textContent = "";
    } catch (error) {
      if (mine !== asked) return;
      // The table still shows the last baseline it had: the select says so, and choosing again retries.
      const wanted = select.selectedOptions.length ? select.selectedOptions[0].textContent : baseline;
      select.value = shown;
      status.textContent = "Could not load the deltas against " + wanted + " (" + error.message +
        "); the table still shows the last baseline. Choose it again to retry.";
    }
  }

  select.addEventListener("change", () => show(select.value));
})();
