"""Inline SVG charts for the HTML report: rejection rate against the threshold, node state timeline.

Why hand-written SVG: the report must be one self-contained page (no scripts, fonts or images
fetched from anywhere: it is opened from a change ticket, often offline), and the two charts are
simple enough that a charting library would be the larger risk. Pure string building over plain
numbers; every text is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

STATE_COLOURS = {
    "pending": "#c8c8c8",
    "applying": "#f0b429",
    "applied": "#2f9e44",
    "restoring": "#e8590c",
    "restored": "#1c7ed6",
    "failed": "#c92a2a",
}
WIDTH, LEFT, RIGHT, TOP = 720, 110, 20, 20


def _fmt_s(s: float) -> str:
    return f"{s / 60:.0f}m" if s >= 120 else f"{s:.0f}s"


def rejection_chart(points: Sequence[tuple[float, float]], threshold: float) -> str:
    """A line of the rejection rate (0..1) over seconds since the change began, with the
    threshold as a dashed line.

    Args:
        points: (seconds, rate) pairs, in time order.
        threshold: the gate's absolute threshold (0..1).
    """
    height, bottom = 240, 30
    plot_w, plot_h = WIDTH - LEFT - RIGHT, height - TOP - bottom
    t_max = max([p[0] for p in points] + [1.0])
    y_max = max([p[1] for p in points] + [threshold * 2, 0.01])

    def x(t: float) -> float:
        return LEFT + plot_w * t / t_max

    def y(r: float) -> float:
        return TOP + plot_h * (1 - r / y_max)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart rejection-rate" '
        f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="rejection rate against threshold">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fafafa" '
        'stroke="#999"/>',
        f'<line class="threshold" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(threshold):.1f}" '
        f'y2="{y(threshold):.1f}" stroke="#c92a2a" stroke-dasharray="6 4"/>',
        f'<text x="{LEFT + plot_w - 4}" y="{y(threshold) - 4:.1f}" text-anchor="end" '
        f'font-size="11" fill="#c92a2a">threshold {threshold * 100:g}%</text>',
        f'<text x="{LEFT - 6}" y="{TOP + 10}" text-anchor="end" font-size="11">'
        f"{y_max * 100:.0f}%</text>",
        f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end" font-size="11">0%</text>',
        f'<text x="{LEFT}" y="{height - 8}" font-size="11">0s</text>',
        f'<text x="{LEFT + plot_w}" y="{height - 8}" text-anchor="end" font-size="11">'
        f"{_fmt_s(t_max)}</text>",
    ]
    if points:
        coords = " ".join(f"{x(t):.1f},{y(r):.1f}" for t, r in points)
        parts.append(
            f'<polyline class="rate" points="{coords}" fill="none" stroke="#1c7ed6" '
            'stroke-width="2"/>'
        )
        for t, r in points:
            parts.append(
                f'<circle class="sample" cx="{x(t):.1f}" cy="{y(r):.1f}" r="3" fill="#1c7ed6">'
                f"<title>{_fmt_s(t)}: {r * 100:.1f}%</title></circle>"
            )
    else:
        parts.append(
            f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle" '
            'font-size="13">no gate verdicts recorded</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def state_timeline(spans: Mapping[str, Sequence[tuple[float, float, str]]], t_end: float) -> str:
    """One row per node, a coloured bar per state span.

    Args:
        spans: node -> (start seconds, end seconds, state) in time order.
        t_end: the end of the time axis (seconds since the change began).
    """
    row, bottom = 26, 40
    height = TOP + row * max(len(spans), 1) + bottom
    plot_w = WIDTH - LEFT - RIGHT
    t_max = max(t_end, 1.0)

    def x(t: float) -> float:
        return LEFT + plot_w * t / t_max

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart state-timeline" '
        f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="node state timeline">'
    ]
    for i, (node, node_spans) in enumerate(spans.items()):
        y0 = TOP + i * row
        parts.append(
            f'<text x="{LEFT - 6}" y="{y0 + row / 2 + 4:.1f}" text-anchor="end" '
            f'font-size="12">{escape(node)}</text>'
        )
        for start, end, state in node_spans:
            w = max(x(end) - x(start), 1.0)
            colour = STATE_COLOURS.get(state, "#868e96")
            parts.append(
                f'<rect class="span {escape(state)}" x="{x(start):.1f}" y="{y0 + 3}" '
                f'width="{w:.1f}" height="{row - 6}" fill="{colour}">'
                f"<title>{escape(node)}: {escape(state)} {_fmt_s(start)}-{_fmt_s(end)}</title>"
                "</rect>"
            )
    axis_y = TOP + row * max(len(spans), 1) + 14
    parts.append(f'<text x="{LEFT}" y="{axis_y}" font-size="11">0s</text>')
    parts.append(
        f'<text x="{LEFT + plot_w}" y="{axis_y}" text-anchor="end" font-size="11">'
        f"{_fmt_s(t_max)}</text>"
    )
    lx = LEFT
    for state, colour in STATE_COLOURS.items():
        parts.append(
            f'<rect x="{lx}" y="{axis_y + 8}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{lx + 14}" y="{axis_y + 17}" font-size="11">{state}</text>'
        )
        lx += 95
    parts.append("</svg>")
    return "\n".join(parts)
