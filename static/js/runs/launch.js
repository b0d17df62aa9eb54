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
  const source = document.getElementById("id_hidden_states");
  let lastDefault = null;
  let sizes = null;  // the inspected target's bytes per token and layer, and the runs' volume's free bytes

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
    sizes = {perLayer: body.bytes_per_token_per_layer, free: body.data_free_bytes, layers: body.num_layers};
    forecast();
  }

  // An offline extraction of at most (max rows x max_seq_len) tokens, each row's captured layers in bf16,
  // against the free room on the runs' volume: when it would not fit, a line offers online hidden states.
  function forecast() {
    const rows = Number(document.getElementById("id_max_samples").value);
    const seqLen = Number(document.getElementById("id_max_seq_len").value);
    let line = document.getElementById("online-offer");
    if (!sizes || !sizes.free || !rows || !seqLen || !source) { if (line) line.hidden = true; return; }
    const ids = layers.value.split(/[ ,]+/).filter((p) => p.trim());
    const captured = ids.length + (ids.includes(String(sizes.layers)) ? 0 : 1);  // the final layer is added
    const bytes = rows * seqLen * captured * sizes.perLayer;
    if (!line) {
      line = window.dom.el("p", {id: "online-offer", class: "field-error"});
      info.after(line);
    }
    line.hidden = bytes <= sizes.free || source.value === "online";
    const button = window.dom.el("button", {type: "button", id: "switch-online"}, "Train online instead");
    button.addEventListener("click", () => {
      source.value = "online";
      document.getElementById("advanced").open = true;
      line.hidden = true;
    });
    line.replaceChildren(`An offline extraction of up to ${bytesText(bytes)} (${rows} rows x ${seqLen} tokens x ` +
      `${captured} layers) would not fit in the ${bytesText(sizes.free)} free for runs. `, button);
  }

  function openTarget() {
    const section = window.location.hash && document.querySelector("details" + window.location.hash);
    if (section) section.open = true;
  }

  // The datasets list hides behind a prefilled path, so the chosen dataset's lineage is said under it.
  const dataset = document.getElementById("id_dataset_path");
  const lineage = document.getElementById("dataset-lineage");
  function showLineage() {
    if (!dataset || !lineage) return;
    const path = dataset.value.trim();
    const option = Array.from(document.querySelectorAll("#datasets option")).find((o) => o.value === path);
    lineage.textContent = !path ? "" : !option ? "Not a registered dataset: it is registered when the run starts."
      : option.dataset.lineage || "A file a user brought: its replies as the file holds them.";
  }

  function nameButton() {
    submit.textContent = vary && vary.value.trim() ? "Launch the sweep" : "Launch";
  }

  target.addEventListener("change", inspect);
  for (const id of ["id_max_samples", "id_max_seq_len", "id_layer_ids", "id_hidden_states"]) {
    const input = document.getElementById(id);
    if (input) input.addEventListener("input", forecast);
  }
  if (vary) vary.addEventListener("input", nameButton);
  if (dataset) dataset.addEventListener("input", showLineage);
  window.addEventListener("hashchange", openTarget);
  openTarget();
  nameButton();
  showLineage();
  inspect();
})();
