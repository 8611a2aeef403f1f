"""A rollout's trace graph as SVG: one row per message node (in the order they were added), one
lane per branch, an edge from each node to its parent. Sampled nodes (the policy's own tokens)
are filled; every node links to its message below the graph."""

from __future__ import annotations

from markupsafe import Markup, escape

from rlbus.schemas import TraceNode
from rlbus.ui.message_view import message_summary

ROW, LANE, PAD = 24, 26, 14
TEXT_WIDTH = 560


def trace_svg(nodes: list[TraceNode]) -> Markup:
    if not nodes:
        return Markup("")
    ordered = sorted(nodes, key=lambda n: n.index)
    lanes: dict[str, int] = {}
    for node in ordered:
        lanes.setdefault(node.branch_id, len(lanes))
    place = {
        n.node_id: (PAD + LANE * lanes[n.branch_id], PAD + ROW * row)
        for row, n in enumerate(ordered)
    }
    text_x = PAD + LANE * len(lanes) + 8
    width, height = text_x + TEXT_WIDTH, PAD * 2 + ROW * (len(ordered) - 1)
    edges, dots = [], []
    for node in ordered:
        x, y = place[node.node_id]
        if node.parent_id in place:
            px, py = place[node.parent_id]
            mid = (py + y) / 2
            edges.append(f'<path class="edge" d="M{px},{py} C{px},{mid} {x},{mid} {x},{y}"/>')
        kind = "sampled" if node.sampled else "context"
        label = f"#{node.index} {node.branch_id} · {node.role}: {message_summary(node.message, 70)}"
        dots.append(
            f'<a href="#node-{node.index}"><circle class="node {kind} role-{escape(node.role)}" '
            f'cx="{x}" cy="{y}" r="6"><title>{escape(label)}</title></circle>'
            f'<text class="node-label" x="{text_x}" y="{y + 4}">{escape(label)}</text></a>'
        )
    legend = ", ".join(f"{branch} (lane {lane + 1})" for branch, lane in lanes.items())
    return Markup(
        f'<svg class="trace" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="trace graph"><title>trace graph: {len(ordered)} nodes, '
        f"branches {escape(legend)}</title>{''.join(edges)}{''.join(dots)}</svg>"
    )
