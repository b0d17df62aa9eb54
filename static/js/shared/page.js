// What pages once did in inline attributes, which the Content-Security-Policy (eagle3web.security) forbids:
// a form asking before it submits (data-confirm), a form of controls that never submits (data-no-submit),
// and a progress bar's width (data-bar-width, in percent; set through the style object, which the
// policy allows, rather than a style="" attribute, which it does not). Loaded by base.html on every page.
(function () {
  "use strict";
  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    if ("noSubmit" in form.dataset || (form.dataset.confirm && !window.confirm(form.dataset.confirm))) ev.preventDefault();
  });
  for (const bar of document.querySelectorAll("[data-bar-width]")) bar.style.width = bar.dataset.barWidth + "%";
})();
