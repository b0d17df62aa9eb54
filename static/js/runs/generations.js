// The checkpoint page's generations table (#generations): each held-out prompt's reply as the latest
// measurement decoded it, read from GET /api/v1/checkpoints/<id>/generations/. Every token is coloured by
// the draft position that proposed it (class pos-N), or marked as the target's own (prefill, correction,
// bonus); each verification forward's tokens sit in one outlined span (.step), and a correction is
// preceded by the draft token it replaced, struck through. The prompts are filtered by length and τ in
// the page, and "Compare with" puts another checkpoint's reply to the same prompt (same prompt_sha256)
// beside each one. Everything from the API reaches the page as text through dom.el.
(function () {
  "use strict";
  const root = document.getElementById("generations");
  if (!root) return;
  const el = window.dom.el;
  const table = document.getElementById("generations-table");
  const status = document.getElementById("generations-status");
  const compare = document.getElementById("generations-compare");
  const filters = {
    minTokens: document.getElementById("gen-min-tokens"), maxTokens: document.getElementById("gen-max-tokens"),
    minTau: document.getElementById("gen-min-tau"), maxTau: document.getElementById("gen-max-tau"),
  };
  const filterError = document.getElementById("generations-filter-error");
  let mine = null;  // this checkpoint's answer
  let other = null;  // the compared checkpoint's answer, or null

  // A token's text as it shows: line breaks and tabs drawn, so a token made of them keeps its colour.
  function shown(text) {
    return String(text).replace(/\n/g, "↵\n").replace(/\t/g, "→\t") || "∅";
  }

  function tokenKind(t) {
    if (t.proposed_at != null) return "pos-" + t.proposed_at;
    if (t.verify_step === 0) return "prefill";
    return t.rejected ? "corrected" : "bonus";
  }

  function tokenTitle(t) {
    const step = t.verify_step === 0 ? "the prefill" : "verification " + t.verify_step;
    if (t.proposed_at != null) return `draft position ${t.proposed_at}, accepted · ${step} · id ${t.id}`;
    if (t.verify_step === 0) return `the target's first token (the prefill) · id ${t.id}`;
    if (t.rejected) return `the target's correction: the draft proposed ${JSON.stringify(t.rejected.text)} ` +
      `(id ${t.rejected.id}) at position ${t.rejected.position}, rejected · ${step} · id ${t.id}`;
    return `the target's bonus token after every draft was accepted · ${step} · id ${t.id}`;
  }

  // A token's title is made when the pointer first rests on it: two thousand titles made up front were a
  // third of a draw's time (bench/tracker/generations_render.py).
  const tokenOf = new WeakMap();  // token span -> its token from the API
  function titleOnHover(ev) {
    const span = ev.target;
    const t = tokenOf.get(span);
    if (t && !span.title) span.title = tokenTitle(t);
  }

  // The reply, one .step span per verification forward. Built with createElement and textContent (as
  // dom.el does, without its attribute loop: a reply has hundreds of tokens).
  function reply(prompt) {
    const box = el("div", {class: "reply"});
    let step = null;
    let span = null;
    for (const t of prompt.tokens) {
      if (t.verify_step !== step) {
        step = t.verify_step;
        span = document.createElement("span");
        span.className = "step";
        box.append(span);
      }
      if (t.rejected) {
        span.append(el("del", {class: "rejected", dataset: {position: String(t.rejected.position)},
          title: `draft position ${t.rejected.position} proposed ${JSON.stringify(t.rejected.text)}, rejected`},
        shown(t.rejected.text)));
      }
      const token = document.createElement("span");
      token.className = "tok " + tokenKind(t);
      token.textContent = shown(t.text);
      tokenOf.set(token, t);
      span.append(token);
    }
    if (prompt.tokens_cut) box.append(el("span", {class: "hint"}, ` … cut at ${prompt.tokens.length} tokens`));
    return box;
  }

  function tau(value) {
    return value == null ? "–" : Number(value).toFixed(2);
  }

  function legend(k) {
    const items = [];
    for (let i = 1; i <= k; i++) {
      items.push(el("li", {}, el("span", {class: "tok pos-" + i}, String(i)), " draft position " + i));
    }
    items.push(el("li", {}, el("span", {class: "tok prefill"}, "a"), " the prefill's token"));
    items.push(el("li", {}, el("del", {class: "rejected"}, "x"), el("span", {class: "tok corrected"}, "y"),
      " correction: the draft's token rejected, the target's instead"));
    items.push(el("li", {}, el("span", {class: "tok bonus"}, "b"), " bonus: the target's token after k accepted"));
    items.push(el("li", {}, el("span", {class: "step"}, "…"), " one verification forward"));
    return el("ul", {class: "gen-legend", id: "generations-legend"}, items);
  }

  function otherCell(prompt) {
    if (!other) return null;
    const match = other.prompts.find((p) => p.prompt_sha256 === prompt.prompt_sha256);
    if (!match) return el("td", {class: "reply-cell empty"}, "not among that checkpoint's measured prompts");
    return el("td", {class: "reply-cell", dataset: {checkpoint: String(other.checkpoint)}},
      el("div", {class: "hint"}, "τ " + tau(match.tau)), reply(match));
  }

  // Each draw, laid out, is timed as the performance measure "generations-render" (bench/tracker/generations_render.py
  // reads it).
  function draw() {
    const started = performance.now();
    const k = mine.num_speculative_tokens || 0;
    const head = el("tr", {}, el("th", {}, "#"), el("th", {}, "Prompt tokens"), el("th", {}, "τ"),
      el("th", {}, "Prompt (its end)"), el("th", {}, mine.label),
      other ? el("th", {}, other.label) : null);
    const rows = mine.prompts.map((p) => el("tr", {dataset: {prompt: String(p.index), tokens: String(p.prompt_tokens),
      tau: String(p.tau), sha256: p.prompt_sha256}},
      el("td", {}, String(p.index + 1)), el("td", {class: "num"}, String(p.prompt_tokens)),
      el("td", {class: "num"}, tau(p.tau)),
      el("td", {class: "prompt-cell"}, el("div", {class: "prompt-tail"}, (p.prompt_cut ? "…" : "") + p.prompt_tail)),
      el("td", {class: "reply-cell"}, reply(p)), otherCell(p)));
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
    const old = document.getElementById("generations-legend");
    if (old) old.replaceWith(legend(k)); else table.before(legend(k));
    applyFilter();
    void table.offsetHeight;  // the layout, which the measure includes
    performance.measure("generations-render", {start: started, end: performance.now()});
    root.dataset.rendered = other ? "compared" : "drawn";
  }

  function bound(input, label) {
    const text = input.value.trim();
    if (!text) return null;
    const value = Number(text);
    if (!Number.isFinite(value) || value < 0) {
      throw new Error(`${label}: give a number from 0, not ${JSON.stringify(text)}`);
    }
    return value;
  }

  function applyFilter() {
    if (!mine) return;
    let b;
    try {
      b = {minTokens: bound(filters.minTokens, "prompt tokens from"),
        maxTokens: bound(filters.maxTokens, "prompt tokens to"),
        minTau: bound(filters.minTau, "τ from"), maxTau: bound(filters.maxTau, "τ to")};
      filterError.textContent = "";
    } catch (err) {
      filterError.textContent = err.message;
      return;
    }
    let shownRows = 0;
    for (const row of table.querySelectorAll("tbody tr")) {
      const n = Number(row.dataset.tokens);
      const t = Number(row.dataset.tau);
      const keep = (b.minTokens == null || n >= b.minTokens) && (b.maxTokens == null || n <= b.maxTokens) &&
        (b.minTau == null || t >= b.minTau) && (b.maxTau == null || t <= b.maxTau);
      row.hidden = !keep;
      if (keep) shownRows++;
    }
    const total = mine.prompts_total;
    status.textContent = `${shownRows} of ${mine.prompts.length} prompts shown` +
      (total > mine.prompts.length ? ` (${total} recorded)` : "") +
      `; replies cut at ${mine.tokens_cap} tokens, the first ${mine.prompts_cap} prompts kept` +
      (other ? `; beside ${other.label} (τ ${tau(other.tau)})` : "");
  }

  async function load(url) {
    const resp = await fetch(url, {headers: {Accept: "application/json"}, cache: "no-store"});
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error || String(resp.status));
    return body;
  }

  async function chooseOther() {
    const option = compare.selectedOptions[0];
    if (!option || !option.dataset.url) {
      other = null;
      draw();
      return;
    }
    try {
      other = await load(option.dataset.url);
      draw();
    } catch (err) {
      status.textContent = "could not read that checkpoint's generations: " + err.message;
    }
  }

  for (const input of Object.values(filters)) input.addEventListener("input", applyFilter);
  table.addEventListener("mouseover", titleOnHover);
  if (compare) compare.addEventListener("change", chooseOther);

  load(root.dataset.url).then((body) => {
    mine = body;
    if (!mine.evaluation) {
      status.textContent = "No measurement of this checkpoint recorded its replies yet: measure its acceptance length.";
      root.dataset.rendered = "empty";
      return;
    }
    if (compare && compare.value) chooseOther(); else draw();
  }).catch((err) => { status.textContent = "could not read the generations: " + err.message; });
})();
