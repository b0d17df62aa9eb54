// The run page's "Hidden-state supply" box (templates/runs/pipeline/_run_body.html): redrawn from each summary
// run_detail.js polls (its "run-summary" event; runs.pipeline.online.selectors.supply_dict words every line), and
// "Keep the cache as an extraction", which asks the API (POST /api/v1/runs/<id>/keep-cache/).
(function () {
  "use strict";
  const box = document.getElementById("supply");
  if (!box) return;
  const el = window.dom.el;
  const button = document.getElementById("keep-cache");

  function keepText(keep) {
    if (keep.status === "succeeded") {
      return ["Kept as ", el("a", {href: keep.url}, "extraction " + keep.extraction_id),
        " (", el("code", {}, keep.path || ""), ")."];
    }
    if (keep.status) return ["Keeping the cache: " + keep.status + (keep.error ? ": " + keep.error : "")];
    return ["The cache is kept as an ordinary extraction once the training succeeded and it holds every row."];
  }

  function render(supply) {
    if (!supply) return;
    document.getElementById("supply-table").replaceChildren(...supply.rows.map((row) =>
      el("tr", {dataset: {supply: row.key}}, el("th", {}, row.label), el("td", {}, row.text))));
    const advice = document.getElementById("supply-advice");
    advice.textContent = supply.advice || "";
    advice.hidden = !supply.advice;
    const kept = document.getElementById("supply-keep");
    if (kept && supply.keep) kept.replaceChildren(...keepText(supply.keep));
    if (button && supply.keep) button.hidden = !supply.keep.offered;
  }

  async function keep() {
    const token = document.querySelector('input[name="csrfmiddlewaretoken"]');
    button.disabled = true;
    try {
      const resp = await fetch(box.dataset.keepUrl, {method: "POST", credentials: "same-origin", body: "{}",
        headers: {"Content-Type": "application/json", "X-CSRFToken": token ? token.value : ""}});
      const body = await resp.json().catch(() => ({}));
      const kept = document.getElementById("supply-keep");
      if (!resp.ok) {
        kept.replaceChildren(el("span", {class: "field-error"}, body.error || resp.statusText));
        button.disabled = false;
        return;
      }
      kept.replaceChildren("Keeping the cache: queued");
      button.hidden = true;
    } catch (err) {
      document.getElementById("supply-keep").replaceChildren(el("span", {class: "field-error"}, String(err)));
      button.disabled = false;
    }
  }

  document.addEventListener("run-summary", (event) => render(event.detail.supply));
  if (button) button.addEventListener("click", keep);
})();
