// The runs list stays live: a running run's duration ticks every second, and while any run on the page
// is held, queued or running the table is read again every 5 s (the same URL, so filters, sort and page hold)
// and its rows replaced, keeping the runs ticked for comparison.
// The bulk form (tag, archive) acts on the runs ticked in the table: the table is a form of its own (compare)
// rendered once for every viewer, so the ticked ids are copied into the bulk form as it is sent.
(function () {
  "use strict";
  const table = document.getElementById("run-table");
  const bulk = document.getElementById("bulk-form");
  if (bulk) {
    bulk.addEventListener("submit", function () {
      for (const old of bulk.querySelectorAll('input[name="ids"]')) old.remove();
      for (const box of document.querySelectorAll('#run-table input[name="ids"]:checked')) {
        const id = document.createElement("input");
        id.type = "hidden";
        id.name = "ids";
        id.value = box.value;
        bulk.appendChild(id);
      }
    });
  }
  if (!table) return;
  const LIVE = 'tr[data-status="held"], tr[data-status="queued"], tr[data-status="running"]';

  function durationText(seconds) {  // runs.tracking.runs_list.run_table.duration_text
    seconds = Math.max(0, Math.floor(seconds));
    if (seconds < 60) return seconds + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min " + String(seconds % 60).padStart(2, "0") + " s";
    return Math.floor(seconds / 3600) + " h " + String(Math.floor(seconds % 3600 / 60)).padStart(2, "0") + " min";
  }

  function tick() {
    for (const cell of table.querySelectorAll("td[data-running-since]")) {
      cell.textContent = durationText((Date.now() - Date.parse(cell.dataset.runningSince)) / 1000);
    }
  }

  async function refresh() {
    if (!table.querySelector(LIVE)) return;
    try {
      const resp = await fetch(window.location.href, {headers: {Accept: "text/html"}});
      if (!resp.ok) return;
      const fresh = new DOMParser().parseFromString(await resp.text(), "text/html").querySelector("#run-table tbody");
      if (!fresh) return;
      const ticked = new Set([...table.querySelectorAll('input[name="ids"]:checked')].map((i) => i.value));
      table.querySelector("tbody").replaceWith(fresh);
      for (const box of table.querySelectorAll('input[name="ids"]')) box.checked = ticked.has(box.value);
      tick();
      table.dataset.refreshed = String(Date.now());
    } catch (err) {
      table.title = "Lost contact with the server (" + err + "); retrying.";
    }
  }

  tick();
  setInterval(tick, 1000);
  setInterval(refresh, 5000);
})();
