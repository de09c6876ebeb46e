// The console's only script (the CSP allows no inline script): htmx settings, Mermaid
// rendering of the run graph, the diff's A/B pickers, and the run page's live output panel
// (Server-Sent Events from /api/runs/{id}/stream).
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

// The run page's live output: one box per step (a child run's steps prefixed with its id),
// filled as frames come. EventSource reconnects by itself with Last-Event-ID (every entry
// once); the "end" event closes it. A newer attempt of a step starts its box again;
// superseded entries (a replay after a retry) are skipped.
function followStream() {
  const panel = document.getElementById("stream-panel");
  if (!panel || !window.EventSource) return;
  const runId = panel.dataset.run;
  const steps = panel.querySelector("#stream-steps");
  const state = panel.querySelector("#stream-status");
  const boxes = new Map();
  function box(frame) {
    const key = (frame.run_id && frame.run_id !== runId ? frame.run_id.slice(0, 8) + "/" : "") + frame.step;
    let found = boxes.get(key);
    if (!found) {
      const el = document.createElement("div");
      el.className = "stream-step";
      el.dataset.step = key;
      const title = document.createElement("h3");
      title.textContent = key + " ";
      const attempt = document.createElement("span");
      attempt.className = "hint stream-attempt";
      title.appendChild(attempt);
      const text = document.createElement("pre");
      text.className = "stream-text";
      el.append(title, text);
      steps.appendChild(el);
      found = { el, attempt, text };
      boxes.set(key, found);
    }
    return found;
  }
  const source = new EventSource(panel.dataset.stream);
  source.onmessage = (event) => {
    const frame = JSON.parse(event.data);
    if (frame.superseded) return;
    panel.hidden = false;
    const b = box(frame);
    if (frame.type === "attempt") {
      b.text.textContent = "";
      b.attempt.textContent = "attempt " + frame.attempt;
      b.el.dataset.attempt = frame.attempt;
      return;
    }
    b.text.textContent += frame.content || "\n" + frame.channel + ": " + JSON.stringify(frame.data) + "\n";
  };
  source.addEventListener("end", (event) => {
    const frame = JSON.parse(event.data);
    state.textContent = "run " + frame.data.status;
    panel.dataset.ended = frame.data.status;
    source.close();
  });
}

document.addEventListener("DOMContentLoaded", followStream);

// The runs page. A filter change reloads the page from its first page (the URL keeps the
// filters, so paging and a reload keep them too).
document.addEventListener("change", (event) => {
  const select = event.target.closest("select[data-autosubmit]");
  if (!select) return;
  select.form.querySelector("input[name=offset]").value = "0";
  select.form.submit();
});

// The runs selected for a bulk action: kept here, since the table is replaced every 2s.
const selectedRuns = new Set();

function showSelection() {
  const bar = document.getElementById("bulk");
  if (!bar) return;
  for (const box of document.querySelectorAll("#runs-list input[name=run_id]")) {
    box.checked = selectedRuns.has(box.value);
  }
  const boxes = [...document.querySelectorAll("#runs-list input[name=run_id]")];
  const all = document.getElementById("select-page");
  if (all) all.checked = boxes.length > 0 && boxes.every((box) => box.checked);
  const count = boxes.filter((box) => box.checked).length;
  bar.dataset.selected = String(count);
  document.getElementById("bulk-count").textContent = `${count} selected`;
  for (const button of bar.querySelectorAll("button.bulk-action")) {
    button.disabled = count === 0;
    button.setAttribute("hx-confirm", `${button.dataset.action} ${count} selected run(s)?`);
  }
}

document.addEventListener("change", (event) => {
  const box = event.target;
  if (box.id === "select-page") {
    for (const one of document.querySelectorAll("#runs-list input[name=run_id]")) {
      if (box.checked) selectedRuns.add(one.value);
      else selectedRuns.delete(one.value);
    }
  } else if (box.name === "run_id" && box.closest("#runs-list")) {
    if (box.checked) selectedRuns.add(box.value);
    else selectedRuns.delete(box.value);
  } else {
    return;
  }
  showSelection();
});

document.addEventListener("htmx:afterSwap", (event) => {
  if (event.detail.target && event.detail.target.id === "runs-list") showSelection();
});

// Acted on: the selection is spent (the summary says what happened to each run).
document.addEventListener("htmx:afterRequest", (event) => {
  if (!event.detail.elt.classList || !event.detail.elt.classList.contains("bulk-action")) return;
  if (event.detail.successful) {
    selectedRuns.clear();
    showSelection();
  }
});

// A full id, copied (the table shows the shortest form that is still unambiguous).
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button.copy[data-copy]");
  if (!button) return;
  try {
    await navigator.clipboard.writeText(button.dataset.copy);
    button.textContent = "copied";
  } catch (err) {
    button.textContent = "copy failed";
  }
  setTimeout(() => { button.textContent = "copy"; }, 1500);
});

document.addEventListener("DOMContentLoaded", showSelection);
