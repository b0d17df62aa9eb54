// Prefill the layer ids with EAGLE-3's default for the typed target, and say what the target is;
// open the folded section a link points at (#sweep, #advanced); name what the button launches.
(function () {
  "use strict";
  const form = document.getElementById("launch-form");
  const target = document.getElementById("id_target_path");
  const layers = document.getElementById("id_layer_ids");
  const info = document.getElementById("target-info");
  const vary = document.getElementById("id_vary");
  const submit = document.getElementById("launch-submit");
  let lastDefault = null;

  // 8,700,000 -> "8.7 MB": decimal units, as the server's messages (runs.fleet.fit.gb_text).
  function bytesText(n) {
    const units = ["bytes", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
    return i === 0 ? `${n} bytes` : `${n.toFixed(1)} ${units[i]}`;
  }

  // The server's error on the target field, if the form came back with one: for the path as submitted.
  let serverError = info.parentElement.querySelector(".field-error:not(#target-info)");

  async function inspect(event) {
    if (event && serverError) { serverError.remove(); serverError = null; }  // another path: not its error
    if (!target.value.trim()) return;
    const resp = await fetch(form.dataset.inspectUrl + "?path=" + encodeURIComponent(target.value.trim()));
    const body = await resp.json();
    if (!resp.ok) {
      // Said once: the server's error for this path is already under the field.
      const said = serverError && serverError.textContent.trim() === body.error;
      info.textContent = said ? "" : body.error;
      info.className = said ? "hint" : "field-error";
      return;
    }
    info.className = "hint";
    info.textContent = `${body.architecture}: ${body.num_layers} layers, hidden ${body.hidden_size}, vocab ${body.vocab_size}` +
      (body.nested_text_config ? " (read from text_config)" : "") + `. EAGLE-3 default layers: ${body.default_layer_ids.join(", ")}.` +
      // What GPU backends are checked against: the workers' GPUs must hold this, with 10% to spare.
      (body.weight_bytes ? ` Weights: ${bytesText(body.weight_bytes)}.` : "");
    const text = body.default_layer_ids.join(", ");
    if (!layers.value.trim() || layers.value === lastDefault) layers.value = text;
    lastDefault = text;
  }

  function openTarget() {
    const section = window.location.hash && document.querySelector("details" + window.location.hash);
    if (section) section.open = true;
  }

  function nameButton() {
    submit.textContent = vary && vary.value.trim() ? "Launch the sweep" : "Launch";
  }

  target.addEventListener("change", inspect);
  if (vary) vary.addEventListener("input", nameButton);
  window.addEventListener("hashchange", openTarget);
  openTarget();
  nameButton();
  inspect();
})();
