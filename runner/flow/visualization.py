"""A flow's picture as CrewAI draws it: a structure of nodes and edges, and an HTML page.

:func:`build_flow_structure` takes a flow object, a flow class or a :class:`FlowDefinition`
and reads only the definition (the one description of a flow's shape), so the picture of a
class and of its declaration are the same. :func:`visualize_flow_structure` writes that
structure as an HTML page with its stylesheet and script beside it (CrewAI's
``<name>_style.css`` / ``<name>_script.js``), drawn in the browser with no network.

Edges: a listener gets one from each *method* its condition names (``condition_type``
``AND`` when that name sits under an ``and``, else ``OR``), and one from each router whose
declared labels its condition names outside any ``and`` (``is_router_event``, the label in
``router_event``). A router with no known labels, and a trigger name that is neither a
method nor a label some router declares, are told as a WARNING: the static picture cannot
join them.
"""

from __future__ import annotations

import html
import json
import logging
import webbrowser
from pathlib import Path
from typing import Any

from runner.flow.definition import Condition, FlowDefinition, FlowMethodDefinition

__all__ = ["build_flow_structure", "visualize_flow_structure"]

log = logging.getLogger(__name__)


def _definition_of(flow: Any) -> FlowDefinition:
    if isinstance(flow, FlowDefinition):
        return flow
    cls: Any = flow if isinstance(flow, type) else type(flow)
    definition: FlowDefinition = cls.flow_definition()
    return definition


def _leaves(cond: Condition | None, under_and: bool = False) -> list[tuple[str, bool]]:
    """Each name of a condition with whether it sits under an ``and``, in order."""
    if cond is None:
        return []
    if isinstance(cond, str):
        return [(cond, under_and)]
    found: list[tuple[str, bool]] = []
    for key, children in cond.items():
        for child in children:
            found += _leaves(child, under_and or key == "and")
    return found


def _tree(cond: Condition) -> dict[str, Any] | None:
    """A condition tree as CrewAI's structure writes it (``{"type": "AND", ...}``)."""
    if isinstance(cond, str):
        return None
    key, children = next(iter(cond.items()))
    return {
        "type": key.upper(),
        "conditions": [c if isinstance(c, str) else _tree(c) for c in children],
    }


def _trigger(m: FlowMethodDefinition) -> Condition | None:
    if m.listen is not None:
        return m.listen
    return m.start if isinstance(m.start, str | dict) else None


def _node(name: str, m: FlowMethodDefinition, class_name: str) -> dict[str, Any]:
    trigger = _trigger(m)
    kind = "router" if m.router else "start" if m.is_start else "listen"
    node: dict[str, Any] = {
        "type": kind,
        "is_start": m.is_start,
        "is_router": m.router,
        "class_name": class_name,
        "description": m.description,
        "trigger_methods": None if trigger is None else [n for n, _ in _leaves(trigger)],
        "condition_type": None,
        "trigger_condition": None,
        "has_human_feedback": m.human_feedback is not None,
    }
    if isinstance(trigger, str):
        node["condition_type"] = "OR"
    elif isinstance(trigger, dict):
        node["condition_type"] = next(iter(trigger)).upper()
        node["trigger_condition"] = _tree(trigger)
    labels = m.labels()
    if m.router and labels:
        node["router_events"] = list(labels)
    return node


def build_flow_structure(flow: Any) -> dict[str, Any]:
    """The nodes (by method), edges, start and router methods of a flow object, class or
    definition, as JSON data."""
    definition = _definition_of(flow)
    methods = definition.methods
    nodes = {name: _node(name, m, definition.name) for name, m in methods.items()}
    emits = {name: m.labels() or [] for name, m in methods.items() if m.router}
    for name, labels in emits.items():
        if not labels:
            log.warning(
                "Router events for '%s' are dynamic: declare them with emit=[...] or a "
                "Literal return annotation to draw its edges",
                name,
            )
    declared = {label for labels in emits.values() for label in labels}
    edges: list[dict[str, Any]] = []
    unmatched: list[str] = []
    for target, m in methods.items():
        for leaf, under_and in _leaves(_trigger(m)):
            if leaf in methods:
                if leaf != target:
                    edges.append(_edge(leaf, target, "AND" if under_and else "OR"))
                continue
            if leaf not in declared and leaf not in unmatched:
                unmatched.append(leaf)
            if under_and:
                continue
            for router, labels in emits.items():
                if leaf in labels and router != target:
                    edges.append(_edge(router, target, "OR", leaf))
    if unmatched:
        log.warning(
            "Static visualization could not match listener triggers to a method or a "
            "declared router event: %s",
            ", ".join(unmatched),
        )
    return {
        "name": definition.name,
        "nodes": nodes,
        "edges": edges,
        "start_methods": [n for n, m in methods.items() if m.is_start],
        "router_methods": [n for n, m in methods.items() if m.router],
    }


def _edge(source: str, target: str, kind: str, event: str | None = None) -> dict[str, Any]:
    return {
        "source": source,
        "target": target,
        "condition_type": kind,
        "is_router_event": event is not None,
        "router_event": event,
    }


_CSS = """:root { --start: #2f855a; --router: #b7791f; --listen: #2b6cb0; }
body { margin: 0; font-family: system-ui, sans-serif; background: #f7fafc; }
#nav-controls { padding: 8px 12px; background: #1a202c; color: #fff; }
#network-container { position: relative; margin: 16px; }
.node { position: absolute; padding: 6px 10px; border-radius: 6px; color: #fff;
        font-size: 13px; cursor: pointer; white-space: nowrap; }
.node.start { background: var(--start); } .node.router { background: var(--router); }
.node.listen { background: var(--listen); }
#drawer { position: fixed; right: 0; top: 0; width: 320px; height: 100%; background: #fff;
          box-shadow: -2px 0 6px #0003; padding: 12px; display: none; overflow: auto; }
#drawer.open { display: block; }
"""

_JS = """// Lays the nodes out by depth and draws the edges as SVG lines.
const FLOW_STRUCTURE = __STRUCTURE__;

class NetworkManager {
  constructor(structure, container, drawer) {
    this.structure = structure; this.container = container; this.drawer = drawer;
  }
  levels() {
    const level = {}; const names = Object.keys(this.structure.nodes);
    names.forEach(n => { level[n] = 0; });
    for (let round = 0; round < names.length; round++) {
      for (const e of this.structure.edges) {
        if (level[e.target] < level[e.source] + 1) level[e.target] = level[e.source] + 1;
      }
    }
    return level;
  }
  render() {
    const level = this.levels(); const column = {}; const at = {};
    for (const [name, node] of Object.entries(this.structure.nodes)) {
      const l = level[name]; column[l] = (column[l] || 0) + 1;
      at[name] = {x: 20 + (column[l] - 1) * 200, y: 20 + l * 90};
      const div = document.createElement("div");
      div.className = "node " + node.type; div.textContent = name;
      div.style.left = at[name].x + "px"; div.style.top = at[name].y + "px";
      div.onclick = () => this.show(name, node);
      this.container.appendChild(div);
    }
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("width", "2000"); svg.setAttribute("height", "2000");
    svg.style.position = "absolute"; svg.style.left = 0; svg.style.top = 0;
    svg.style.zIndex = -1;
    for (const e of this.structure.edges) {
      const line = document.createElementNS("http://www.w3.org/2000/svg", "line");
      line.setAttribute("x1", at[e.source].x + 40); line.setAttribute("y1", at[e.source].y + 30);
      line.setAttribute("x2", at[e.target].x + 40); line.setAttribute("y2", at[e.target].y);
      line.setAttribute("stroke", e.is_router_event ? "#b7791f" : "#4a5568");
      if (e.condition_type === "AND") line.setAttribute("stroke-dasharray", "4 3");
      svg.appendChild(line);
    }
    this.container.appendChild(svg);
  }
  show(name, node) {
    this.drawer.textContent = name + "\\n" + JSON.stringify(node, null, 2);
    this.drawer.style.whiteSpace = "pre"; this.drawer.classList.add("open");
  }
}

new NetworkManager(FLOW_STRUCTURE, document.getElementById("network-container"),
                   document.getElementById("drawer")).render();
"""

_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>CrewAI Flow Visualization: {name}</title>
<link rel="stylesheet" href="{css}">
</head>
<body>
<div id="nav-controls">CrewAI Flow Visualization: {name}</div>
<div id="network-container"></div>
<div id="drawer"></div>
<script src="{js}"></script>
</body>
</html>
"""


def visualize_flow_structure(
    structure: dict[str, Any], filename: str | Path = "flow_visualization.html", show: bool = True
) -> str:
    """Write ``structure`` as an HTML page at ``filename`` (``.html`` added if missing) with
    ``<stem>_style.css`` and ``<stem>_script.js`` beside it; open it in a browser when
    ``show``. Returns the page's path."""
    page = Path(filename)
    if page.suffix != ".html":
        page = page.with_name(page.name + ".html")
    page = page.resolve()
    page.parent.mkdir(parents=True, exist_ok=True)
    css = page.with_name(f"{page.stem}_style.css")
    js = page.with_name(f"{page.stem}_script.js")
    css.write_text(_CSS, encoding="utf-8")
    # </script> inside the data would end the script early: escape the slash.
    data = json.dumps(structure).replace("</", "<\\/")
    js.write_text(_JS.replace("__STRUCTURE__", data), encoding="utf-8")
    name = html.escape(str(structure.get("name") or "flow"))
    page.write_text(_HTML.format(name=name, css=css.name, js=js.name), encoding="utf-8")
    if show:
        webbrowser.open(page.as_uri())
    return str(page)
