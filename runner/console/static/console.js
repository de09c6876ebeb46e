// The console's only script (the CSP allows no inline script): htmx settings, Mermaid
// rendering of the run graph, and the diff's A/B pickers.
"use strict";

// Swap error responses too: the server sends an HTML fragment (a form with its field
// errors, or an error box) for every 4xx/5xx an htmx request gets. 204: nothing to swap.
htmx.config.responseHandling = [
  { code: "204", swap: false },
  { code: "[23]..", swap: true },
  { code: "[45]..", swap: true, error: true },
];
// Script tags are never evaluated in swapped content, and no eval is needed.
htmx.config.allowScriptTags = false;
htmx.config.allowEval = false;

mermaid.initialize({ startOnLoad: false, securityLevel: "strict", theme: "neutral" });

let graphs = 0;

async function renderGraphs() {
  for (const box of document.querySelectorAll("[data-mermaid]:not([data-rendered])")) {
    box.setAttribute("data-rendered", "pending");
    const source = box.dataset.mermaid; // the chart's text, HTML-escaped in the attribute
    try {
      const { svg } = await mermaid.render("graph-" + ++graphs, source);
      box.querySelector(".graph-svg").innerHTML = svg; // strict mode: labels are escaped
      box.setAttribute("data-rendered", "ok");
    } catch (err) {
      box.querySelector(".graph-svg").textContent = "graph not drawn: " + err;
      box.setAttribute("data-rendered", "failed");
    }
  }
}

// An action's error (e.g. 409: the run is running) goes to the flash area; the fork form
// comes back whole, with its errors in it.
document.addEventListener("htmx:beforeSwap", (event) => {
  const detail = event.detail;
  const post = detail.requestConfig && detail.requestConfig.verb === "post";
  if (detail.xhr.status >= 400 && post && detail.target && detail.target.id !== "fork-form") {
    detail.target = document.getElementById("flash");
  }
});

document.addEventListener("DOMContentLoaded", renderGraphs);
document.addEventListener("htmx:afterSettle", renderGraphs);

document.addEventListener("click", (event) => {
  const pick = event.target.closest("[data-diff-side]");
  if (!pick) return;
  const input = document.querySelector(`#diff-form input[name='${pick.dataset.diffSide}']`);
  input.value = pick.dataset.ckpt;
  input.focus();
});
