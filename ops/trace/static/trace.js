// agentrl trace: the page's only script (the server's CSP allows no inline script).
// A changed filter applies at once; "a" switches the advantage colours off and on.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("filters");
  if (form) {
    for (const select of form.querySelectorAll("select")) {
      select.addEventListener("change", () => form.requestSubmit());
    }
    // an empty field means "any": leave it out of the address
    form.addEventListener("formdata", (event) => {
      for (const [name, value] of [...event.formData.entries()]) {
        if (value === "") event.formData.delete(name);
      }
    });
  }
  document.addEventListener("keydown", (event) => {
    if (event.key === "a" && !(event.target instanceof HTMLInputElement)) {
      document.body.classList.toggle("plain");
    }
  });
  document.body.dataset.script = "ready";
});
