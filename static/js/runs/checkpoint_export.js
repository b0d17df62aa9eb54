// The run page's Export buttons (templates/runs/checkpoints/_checkpoints.html): the checkpoints table is rendered once
// for every viewer, without a CSRF token, so the page's own token (the tags form's) is added on submit.
// Listening on the document keeps working when the table is replaced by a newer rendering.
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!form.classList || !form.classList.contains("export-checkpoint")) return;
  if (form.querySelector('input[name="csrfmiddlewaretoken"]')) return;
  const token = document.querySelector('input[name="csrfmiddlewaretoken"]');
  if (!token) return;  // a page without a form of its own: the server answers 403, saying so
  const copy = document.createElement("input");
  copy.type = "hidden";
  copy.name = "csrfmiddlewaretoken";
  copy.value = token.value;
  form.appendChild(copy);
});
