// A "Copy" button after every <code class="copy">: commands people paste into a terminal.
(function () {
  "use strict";
  function attach(code) {
    if (code.dataset.copyReady) return;
    code.dataset.copyReady = "1";
    const button = document.createElement("button");
    button.type = "button";
    button.className = "copy-button";
    button.textContent = "Copy";
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(code.textContent);
        button.textContent = "Copied";
      } catch (err) {  // no clipboard (plain http on a cluster): select the text for Ctrl-C instead
        const range = document.createRange();
        range.selectNodeContents(code);
        const sel = window.getSelection();
        sel.removeAllRanges();
        sel.addRange(range);
        button.textContent = "Selected: press Ctrl-C";
      }
      setTimeout(() => { button.textContent = "Copy"; }, 2000);
    });
    code.after(button);
  }
  const scan = () => document.querySelectorAll("code.copy").forEach(attach);
  new MutationObserver(scan).observe(document.body, {childList: true, subtree: true});
  scan();
})();
