// A page that shows jobs (templates/runs/data/_jobs.html) follows them: while one is queued or running it
// reloads every 3 s, but never while the person is typing (a field has focus, or a text area holds
// words not yet sent), so that a review or an override being written is not wiped.
(function () {
  var active = 'table.jobs tr[data-status="queued"], table.jobs tr[data-status="running"]';
  if (!document.querySelector(active)) return;
  setInterval(function () {
    var focused = document.activeElement;
    var typing = focused && /^(INPUT|TEXTAREA|SELECT)$/.test(focused.tagName);
    var unsent = Array.prototype.some.call(document.querySelectorAll("textarea"), function (t) { return t.value.trim(); });
    if (!typing && !unsent) window.location.reload();
  }, 3000);
})();
