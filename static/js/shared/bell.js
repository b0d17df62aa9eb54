// The nav's alert bell: its unread count polled once a minute from GET /api/v1/alerts/ (what a script
// reads), so a run failing while a page stays open shows up without a reload. Built as text (dom.js rules).
(function () {
  "use strict";
  const bell = document.getElementById("alert-bell");
  if (!bell || !bell.dataset.url) return;
  const PERIOD_MS = 60000;

  function show(unread) {
    let badge = document.getElementById("alert-unread");
    bell.title = `Alerts: ${unread} unread`;
    if (!unread) {
      if (badge) badge.remove();
      return;
    }
    if (!badge) {
      badge = document.createElement("span");
      badge.className = "badge";
      badge.id = "alert-unread";
      bell.append(" ", badge);
    }
    badge.textContent = String(unread);
  }

  async function poll() {
    if (document.hidden) return;  // a tab nobody looks at asks nothing
    try {
      const resp = await fetch(bell.dataset.url, {headers: {Accept: "application/json"}, cache: "no-store"});
      if (resp.ok) show((await resp.json()).unread);
    } catch (err) {
      // offline for a moment: the next poll tries again
    }
  }

  window.setInterval(poll, Number(bell.dataset.period || PERIOD_MS));
  document.addEventListener("visibilitychange", poll);
})();
