// Strings from data (run names, tags, metric keys, paths, messages, log tails) reach a page as text,
// never as HTML: scripts build their elements with dom.el, which puts every string in a text node or an
// attribute's value, instead of interpolating data into innerHTML. Plotly reads its labels (trace names,
// titles, tick labels, hover templates) as a small HTML of its own (<b>, <br>, <a href>), so what it
// shows of data goes through dom.plotlyText first. Loaded by base.html before any page's script.
(function () {
  "use strict";

  // el("a", {href: url, class: "export", dataset: {key}}, "text", node, ...): string children become text
  // nodes; null, undefined and false attributes and children are left out; true is an empty attribute.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value == null || value === false) continue;
      if (name === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child == null || child === false) continue;
      node.append(child instanceof Node ? child : String(child));  // append(string) makes a text node
    }
    return node;
  }

  // Plotly turns &lt; &gt; &amp; back into the characters it draws, so escaped text is drawn as typed
  // and none of it becomes a tag or a link.
  function plotlyText(text) {
    return String(text == null ? "" : text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  window.dom = {el, plotlyText};
})();
