// Prefill the layer ids with EAGLE-3's default for the typed target, and say what the target is.
(function () {
  "use strict";
  const form = document.getElementById("launch-form");
  const target = document.getElementById("id_target_path");
  const layers = document.getElementById("id_layer_ids");
  const info = document.getElementById("target-info");
  let lastDefault = null;

  async function inspect() {
    if (!target.value.trim()) return;
    const resp = await fetch(form.dataset.inspectUrl + "?path=" + encodeURIComponent(target.value.trim()));
    const body = await resp.json();
    if (!resp.ok) { info.textContent = body.error; info.className = "field-error"; return; }
    info.className = "hint";
    info.textContent = `${body.architecture}: ${body.num_layers} layers, hidden ${body.hidden_size}, vocab ${body.vocab_size}` +
      (body.nested_text_config ? " (read from text_config)" : "") + `. EAGLE-3 default layers: ${body.default_layer_ids.join(", ")}.` +
      // What GPU backends are checked against: the workers' GPUs must hold this, with 10% to spare.
      (body.weight_bytes ? ` Weights: ${(body.weight_bytes / 1e9).toFixed(1)} GB.` : "");
    const text = body.default_layer_ids.join(", ");
    if (!layers.value.trim() || layers.value === lastDefault) layers.value = text;
    lastDefault = text;
  }
  target.addEventListener("change", inspect);
  inspect();
})();
