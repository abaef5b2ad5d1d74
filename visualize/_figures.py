"""Plotly figures of the views (plotly is imported inside each builder: it is the app extra's)."""

from __future__ import annotations

import math
from typing import Any

import networkx as nx

from ._buffers import BufferTable
from ._colors import chunk_colors, mix, rank_colors
from ._compare import Comparison, coincident, size_label
from ._ddp import DdpBar, DdpGantt
from ._timeline import Timeline

__all__ = [
    "graph_figure",
    "buffer_figure",
    "timeline_figure",
    "comparison_figure",
    "wait_for_figure",
    "ddp_figure",
    "ddp_lanes",
]

US = 1e6  # figures show microseconds
INK = "#222222"  # axis and legend text of the figures meant to be projected


def _go() -> Any:
    import plotly.graph_objects as go

    return go


PROJECTED = {"size": 14, "color": "#222222"}
"""The font of the Collectives figures: legible on a projector at 1280x720."""


def _projected(fig: Any) -> None:
    """Set every text of ``fig`` that a theme could shrink (title, ticks, axis titles) to :data:`PROJECTED`."""
    fig.update_layout(font=PROJECTED, title_font={**PROJECTED, "size": 16})
    fig.update_xaxes(tickfont=PROJECTED, title_font=PROJECTED)
    fig.update_yaxes(tickfont=PROJECTED, title_font=PROJECTED)


def _blank_axes(fig: Any) -> None:
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, scaleanchor="x", scaleratio=1)
    fig.update_layout(plot_bgcolor="white", showlegend=False, margin=dict(l=10, r=10, t=40, b=10))


def _shorten(a: tuple[float, float], b: tuple[float, float], gap: float) -> tuple[tuple[float, float], ...]:
    """The segment ``a -> b`` pulled back by ``gap`` at both ends (so arrows stop at the markers)."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    length = (dx * dx + dy * dy) ** 0.5 or 1.0
    ux, uy = dx / length, dy / length
    return (a[0] + ux * gap, a[1] + uy * gap), (b[0] - ux * gap, b[1] - uy * gap)


def graph_figure(g: nx.MultiDiGraph) -> Any:
    """A plotly Figure of :func:`step_graph`: ranks in their topology positions, messages as arrows.

    Topology links are drawn faintly, each arrow in its sender's colour and labelled
    with its chunk; parallel messages between one pair are offset sideways.

    Args:
        g: a :func:`step_graph`.

    Returns:
        A ``plotly.graph_objects.Figure``, titled with the op, algorithm and round.

    Example:
        >>> from simdist.visualize import collective_run, graph_figure, step_graph
        >>> fig = graph_figure(step_graph(collective_run("all_reduce", "ring", 4, 64).trace, 1))
        >>> fig.layout.title.text
        'all_reduce (ring), round 1 of 6'
    """
    go = _go()
    fig = go.Figure()
    pos = {n: d["pos"] for n, d in g.nodes(data=True)}
    pos.update(g.graph.get("switches", {}))
    lx, ly = [], []
    for u, v in g.graph.get("links", []):
        if u in pos and v in pos:
            lx += [pos[u][0], pos[v][0], None]
            ly += [pos[u][1], pos[v][1], None]
    if lx:
        fig.add_trace(go.Scatter(x=lx, y=ly, mode="lines", line=dict(color="#DDDDDD", width=1), hoverinfo="skip"))
    sw = g.graph.get("switches", {})
    if sw:
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in sw.values()], y=[p[1] for p in sw.values()], mode="markers",
                marker=dict(symbol="square", size=10, color="#BBBBBB"), text=list(sw), hoverinfo="text",
            )
        )  # fmt: skip
    world = g.graph.get("world", g.number_of_nodes())
    size = 30 if world <= 8 else 22
    gap = 0.09 if world <= 8 else 0.07
    seen: dict[tuple[int, int], int] = {}
    mids_x, mids_y, mids_t = [], [], []
    by_sender: dict[int, tuple[list, list]] = {}
    for u, v, d in g.edges(data=True):
        k = seen[(u, v)] = seen.get((u, v), -1) + 1
        a, b = _shorten(pos[u], pos[v], gap)
        dx, dy = b[0] - a[0], b[1] - a[1]
        off = 0.03 * (k + 0.5 if g.has_edge(v, u) else k)  # pairs both ways and repeats side by side
        norm = (dx * dx + dy * dy) ** 0.5 or 1.0
        ox, oy = -dy / norm * off, dx / norm * off
        xs, ys = by_sender.setdefault(u, ([], []))
        xs += [a[0] + ox, b[0] + ox, None]
        ys += [a[1] + oy, b[1] + oy, None]
        mids_x.append((a[0] + b[0]) / 2 + ox)
        mids_y.append((a[1] + b[1]) / 2 + oy)
        chunk = "several chunks" if d.get("chunk") is None else f"chunk {d['chunk']}"
        mids_t.append(f"{u} → {v}: {d.get('nbytes', 0)} B, {chunk}<br>{d.get('t_start', 0) * US:.3f}–"
                      f"{d.get('t_end', 0) * US:.3f} µs")  # fmt: skip
    for u, (xs, ys) in sorted(by_sender.items()):
        fig.add_trace(
            go.Scatter(
                x=xs, y=ys, mode="lines+markers", line=dict(color=g.nodes[u]["color"], width=1.5), opacity=0.85,
                marker=dict(symbol="arrow", angleref="previous", size=[0, 11, 0] * (len(xs) // 3)),
                hoverinfo="skip",
            )
        )  # fmt: skip
    if mids_x:
        fig.add_trace(
            go.Scatter(x=mids_x, y=mids_y, mode="markers", marker=dict(size=6, opacity=0), text=mids_t,
                       hoverinfo="text")
        )  # fmt: skip
    nodes = sorted(n for n in g.nodes if isinstance(n, int))
    fig.add_trace(
        go.Scatter(
            x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers+text",
            marker=dict(size=size, color=[g.nodes[n]["color"] for n in nodes], line=dict(color="white", width=1)),
            text=[str(n) for n in nodes], textfont=dict(color="white", size=15 if world <= 8 else 12),
            hovertext=[f"rank {n}: sent {g.nodes[n]['sent']}, received {g.nodes[n]['received']}" for n in nodes],
            hoverinfo="text",
        )
    )  # fmt: skip
    title = f"round {g.graph.get('step')}" + (f" of {g.graph['rounds']}" if g.graph.get("rounds") else "")
    if g.graph.get("op"):
        title = f"{g.graph['op']} ({g.graph.get('algorithm')}), {title}"
    fig.update_layout(title=title)
    _blank_axes(fig)
    _projected(fig)
    return fig


def _cell_color(cell: Any, encoding: str, world: int) -> str:
    if encoding == "bits":
        if not cell.ranks or cell.chunk is None:
            return "#F4F4F4"
        return mix(chunk_colors(world)[cell.chunk % world], 0.25 + 0.75 * len(cell.ranks) / world)
    if encoding == "blocks":
        return rank_colors(world)[cell.origin] if cell.origin is not None else "#F4F4F4"
    return "#DDDDDD"


def _cell_text(cell: Any, encoding: str, world: int) -> str:
    if encoding == "bits":
        return f"{len(cell.ranks)}/{world}" if cell.ranks else ""
    if encoding == "blocks":
        return f"r{cell.origin}" if cell.origin is not None else ""
    return f"{cell.value:g}"


NUMBERS_UP_TO = 24
"""A buffer figure writes each cell's number where a row holds at most this many values (else hover only)."""


def shows_numbers(table: BufferTable) -> bool:
    """Whether :func:`buffer_figure` writes a number in each cell of ``table`` (rows of at most
    :data:`NUMBERS_UP_TO` values).

    Args:
        table: a :func:`buffer_table`.

    Returns:
        ``True`` where every row holds at most :data:`NUMBERS_UP_TO` values.

    Example:
        >>> from simdist.visualize import buffer_table, collective_run, shows_numbers
        >>> shows_numbers(buffer_table(collective_run("all_reduce", "ring", 4, 64).trace, 1))
        True
    """
    return max((len(r.cells) for r in table.rows), default=0) <= NUMBERS_UP_TO


def buffer_figure(table: BufferTable) -> Any:
    """A plotly Figure of :func:`buffer_table`: one row per rank, one cell per leading value.

    Reduced data (all_reduce, reduce, reduce_scatter) is coloured by chunk, paler while
    fewer ranks' inputs are summed in (the text says how many); moved data is coloured
    by the rank it came from. Rows rebuilt from the inputs are marked.

    Args:
        table: a :func:`buffer_table`.

    Returns:
        A ``plotly.graph_objects.Figure`` (one heatmap), titled with the op, algorithm and round.

    Example:
        >>> from simdist.visualize import buffer_figure, buffer_table, collective_run
        >>> fig = buffer_figure(buffer_table(collective_run("all_reduce", "ring", 4, 64).trace, 1))
        >>> fig.layout.title.text, fig.data[0].type
        ('all_reduce (ring) after round 1', 'heatmap')
    """
    go = _go()
    palette: list[str] = []
    index: dict[str, int] = {}
    width = max((len(r.cells) for r in table.rows), default=0)
    z, text, hover = [], [], []
    for row in table.rows:
        zr, tr, hr = [], [], []
        for i in range(width):
            if i >= len(row.cells):
                zr.append(None)
                tr.append("")
                hr.append("")
                continue
            c = row.cells[i]
            color = _cell_color(c, table.encoding, table.world)
            zr.append(index.setdefault(color, len(index)))
            if len(palette) < len(index):
                palette.append(color)
            tr.append(_cell_text(c, table.encoding, table.world))
            hr.append(f"rank {row.rank}[{i}] = {c.value:g}<br>chunk {c.chunk}, from ranks {list(c.ranks)}")
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    k = max(len(palette), 1)
    scale = []
    for j, color in enumerate(palette or ["#FFFFFF"]):
        scale += [(j / k, color), ((j + 1) / k, color)]
    zz = [[None if v is None else v + 0.5 for v in r] for r in z]
    labels = [f"rank {r.rank}" + (" (input)" if r.source == "input" else "") for r in table.rows]
    fig = go.Figure(
        go.Heatmap(
            z=zz, x=list(range(width)), y=labels, colorscale=scale, zmin=0, zmax=k, showscale=False,
            text=text, texttemplate="%{text}" if shows_numbers(table) else "", textfont=dict(size=12), hovertext=hover,
            hoverinfo="text",
            xgap=1, ygap=1,
        )
    )  # fmt: skip
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="element")
    name = f"{table.op} ({table.algorithm})" if table.op else "buffers"
    when = "at the end" if table.step > table.rounds else f"after round {table.step}"
    if table.step == 0:
        when = "before any message"
    elif any(r.source == "work" for r in table.rows):
        when += " (working data)"
    _projected(fig)
    fig.update_layout(title=f"{name} {when}", plot_bgcolor="white",
                      height=max(200, 28 * len(table.rows) + 80), margin=dict(l=10, r=10, t=40, b=10))  # fmt: skip
    return fig


def timeline_figure(tl: Timeline, round: int | None = None) -> Any:
    """A plotly Figure of :func:`timeline`: a lane per rank (µs), each message an arrow from sender to receiver.

    Span bars are coloured by rank; messages in their sender's colour; messages that
    shared a link in flight (contention) are drawn thick and red. With ``round``, that
    communication round is marked: a shaded band over its messages' time and the messages
    themselves drawn over in black (the legend's ``round k``).

    Args:
        tl: a :func:`timeline`.
        round: the round to mark (as :func:`step_graph` numbers them), or ``None``.

    Returns:
        A ``plotly.graph_objects.Figure``: a bar trace per rank, then a scatter trace of
        arrows per sender.

    Example:
        >>> from simdist.visualize import collective_run, timeline, timeline_figure
        >>> fig = timeline_figure(timeline(collective_run("all_reduce", "ring", 4, 64).trace))
        >>> fig.layout.title.text, [trace.name for trace in fig.data][:2]
        ('timeline on switch: 24 messages', ['rank 0', 'rank 1'])
    """
    go = _go()
    colors = rank_colors(tl.world)
    fig = go.Figure()
    for r, spans in tl.lanes.items():
        if not spans:
            continue
        fig.add_trace(
            go.Bar(
                base=[s.t_start * US for s in spans], x=[(s.t_end - s.t_start) * US for s in spans],
                y=[r] * len(spans), orientation="h", width=0.5, marker=dict(color=colors[r], opacity=0.35),
                hovertext=[f"rank {r}: {s.label}<br>{s.t_start * US:.3f}–{s.t_end * US:.3f} µs" for s in spans],
                hoverinfo="text", name=f"rank {r}", showlegend=False,
            )
        )  # fmt: skip
    contended = {c.first for c in tl.contention} | {c.second for c in tl.contention}
    by_sender: dict[int, tuple[list, list, list]] = {}
    for a in tl.arrows:
        xs, ys, tips = by_sender.setdefault(-1 if a.index in contended else a.src, ([], [], []))
        xs += [a.t_start * US, a.t_end * US, None]
        ys += [a.src, a.dst, None]
        chunk = "several chunks" if a.chunk is None else f"chunk {a.chunk}"
        tip = f"{a.src} → {a.dst}: {a.nbytes} B, {chunk}" + ("" if a.round is None else f", round {a.round}")
        tips += [tip, tip, None]
    for src, (xs, ys, tips) in sorted(by_sender.items()):
        hot = src == -1
        fig.add_trace(
            go.Scatter(
                x=xs, y=ys, mode="lines+markers", hovertext=tips, hoverinfo="text",
                line=dict(color="#D62728" if hot else colors[src], width=2.5 if hot else 1),
                marker=dict(symbol="arrow", angleref="previous", size=[0, 8, 0] * (len(xs) // 3)),
                name="contention" if hot else f"from rank {src}", showlegend=hot,
            )
        )  # fmt: skip
    marked = [a for a in tl.arrows if round is not None and a.round == round]
    if marked:
        start, end = min(a.t_start for a in marked) * US, max(a.t_end for a in marked) * US
        fig.add_vrect(x0=start, x1=end, fillcolor="#FFE08A", opacity=0.45, layer="below", line_width=0)
        xs, ys = [], []
        for a in marked:
            xs += [a.t_start * US, a.t_end * US, None]
            ys += [a.src, a.dst, None]
        fig.add_trace(
            go.Scatter(
                x=xs, y=ys, mode="lines+markers", hoverinfo="skip", name=f"round {round}",
                line=dict(color=INK, width=3),
                marker=dict(symbol="arrow", angleref="previous", size=[0, 11, 0] * len(marked)),
            )
        )  # fmt: skip
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=list(range(tl.world)),
                     ticktext=[f"rank {r}" for r in range(tl.world)])  # fmt: skip
    fig.update_xaxes(title="virtual time (µs)")
    title = f"timeline on {tl.topology}: {len(tl.arrows)} messages"
    if tl.contention:
        title += f", {len(tl.contention)} link conflicts"
    if marked:
        title += f"; round {round} marked"
    _projected(fig)
    fig.update_layout(title=title, barmode="overlay", plot_bgcolor="white", height=max(250, 26 * tl.world + 100),
                      margin=dict(l=10, r=10, t=40, b=10), showlegend=bool(tl.contention or marked))  # fmt: skip
    return fig


MARKERS = ("circle", "square", "diamond", "triangle-up", "x", "star", "triangle-down", "cross")
COINCIDENT_SHIFT = 2**0.18  # the x offset (a factor) between curves that coincide


def _time_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Tick values (µs) and labels ("1 µs", "10 ms") for a log axis from ``lo`` to ``hi`` µs."""
    vals = []
    k = math.floor(math.log10(lo))
    while 10**k <= hi * 1.0001:
        vals.append(10.0**k)
        k += 1
    if len(vals) < 3:  # under two decades: add 2 and 5 times each power of ten
        vals = sorted(v * m for v in [vals[0] / 10, *vals] for m in (1, 2, 5) if lo / 1.0001 <= v * m <= hi * 1.0001)
    text = []
    for v in vals:
        unit, scale = ("s", 1e6) if v >= 1e6 else ("ms", 1e3) if v >= 1e3 else ("µs", 1.0) if v >= 1 else ("ns", 1e-3)
        text.append(f"{v / scale:g} {unit}")
    return vals, text


def _size_ticks(sizes: tuple[int, ...]) -> tuple[list[int], list[str]]:
    """At most 8 of ``sizes``, evenly picked, labelled in binary units."""
    step = max(1, math.ceil(len(sizes) / 8))
    picked = [n for n in sizes[::step] if n > 0]
    return picked, [size_label(n) for n in picked]


def comparison_figure(cmp: Comparison, slowest: bool = False) -> Any:
    """A plotly Figure of :func:`compare_algorithms`: time against size, both axes logarithmic.

    Each algorithm has its own colour and marker: the simulated curve (markers, thick solid
    line; in the legend) and the alpha-beta formula's prediction (thin dashed line in the
    same colour, no markers; one legend entry stands for all of them), with
    ranks 0 and 1's α, β, or the slowest pair's with ``slowest``. Curves that
    :func:`coincident` finds identical are shifted sideways by a factor of
    ``COINCIDENT_SHIFT`` each, so every one shows (the hover gives the true size). Sizes are
    labelled in binary units, times in µs/ms; dotted lines mark simulated crossovers.

    Args:
        cmp: a :func:`compare_algorithms`.
        slowest: draw the model with the slowest pair's α, β instead of ranks 0 and 1's.

    Returns:
        A ``plotly.graph_objects.Figure``: per algorithm its simulated curve, then its model line.

    Example:
        >>> from simdist.visualize import compare_algorithms, comparison_figure
        >>> fig = comparison_figure(compare_algorithms("all_reduce", 4, [64, 1 << 20]))
        >>> [trace.name for trace in fig.data][:2]
        ['ring', 'ring (model)']
    """
    go = _go()
    colors = rank_colors(len(cmp.curves))
    shift = {name: COINCIDENT_SHIFT**k for group in coincident(cmp) for k, name in enumerate(group)}
    fig = go.Figure()
    times = []
    for i, (c, color) in enumerate(zip(cmp.curves, colors)):
        xs = [n * shift.get(c.algorithm, 1.0) for n in cmp.sizes]
        labels = [size_label(n) for n in cmp.sizes]
        model = c.model_slowest if slowest and c.model_slowest else c.model
        times += [t * US for t in (*c.simulated, *model) if t > 0]
        fig.add_trace(
            go.Scatter(
                x=xs, y=[t * US for t in c.simulated], mode="lines+markers", name=c.algorithm,
                legendgroup=c.algorithm, line={"color": color, "width": 2.5, "dash": "solid"},
                marker={"symbol": MARKERS[i % len(MARKERS)], "size": 10, "color": color},
                customdata=labels, hovertemplate=f"{c.algorithm}, simulated<br>%{{customdata}}: %{{y:.4g}} µs"
                                                 "<extra></extra>",
            )
        )  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=xs, y=[t * US for t in model], mode="lines", name=f"{c.algorithm} (model)", showlegend=False,
                legendgroup=c.algorithm, line={"color": color, "width": 1.5, "dash": "dash"}, opacity=0.8,
                customdata=labels, hovertemplate=f"{c.algorithm}, model: {c.formula}<br>%{{customdata}}: "
                                                 "%{y:.4g} µs<extra></extra>",
            )
        )  # fmt: skip
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="model (thin dashed)",
                             line={"color": "#555555", "width": 1.5, "dash": "dash"}))  # fmt: skip
    for x in cmp.crossovers:
        at = (x.below * x.above) ** 0.5 if x.below > 0 else x.above
        fig.add_vline(x=at, line={"color": "#888888", "dash": "dot"})
    tickvals, ticktext = _size_ticks(cmp.sizes)
    axis = {"tickfont": {"size": 14, "color": INK}, "title_font": {"size": 15, "color": INK}, "gridcolor": "#EEEEEE"}
    fig.update_xaxes(type="log", title="message size n", tickvals=tickvals, ticktext=ticktext,
                     minor={"showgrid": False}, **axis)  # fmt: skip
    if times:
        yvals, ytext = _time_ticks(min(times), max(times))
        fig.update_yaxes(tickvals=yvals, ticktext=ytext)
    fig.update_yaxes(type="log", title="virtual time", **axis)
    which = f"ranks 0 and {cmp.slowest[1]}" if slowest else "ranks 0 and 1"
    fig.update_layout(title=f"{cmp.op} on {cmp.world} ranks, {cmp.topology} topology (model: α, β of {which})",
                      plot_bgcolor="white", height=520, font={"size": 14}, legend={"font": {"size": 14, "color": INK}},
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})  # fmt: skip
    return fig


_EM = 0.62  # a character's width in em, a little over a sans-serif font's average, to estimate text boxes
_LINE = 1.3  # a line's height in em
_NODE_FONT, _EDGE_FONT = 18, 16  # px: legible from the back of a lecture hall


def _text_box(text: str, size: int, pad: int) -> tuple[float, float]:
    """The width and height in px of an annotation showing ``text`` (lines split by ``<br>``)."""
    lines = [line.replace("<b>", "").replace("</b>", "") for line in text.split("<br>")]
    return max(len(line) for line in lines) * size * _EM + 2 * pad, len(lines) * size * _LINE + 2 * pad


def _overlap(a: tuple[float, ...], b: tuple[float, ...], gap: float = 4.0) -> bool:
    """Whether boxes ``(x, y, w, h)`` (centred) come closer than ``gap``."""
    return abs(a[0] - b[0]) < (a[2] + b[2]) / 2 + gap and abs(a[1] - b[1]) < (a[3] + b[3]) / 2 + gap


def _edge_end(c: tuple[float, float], d: tuple[float, float], box: tuple[float, ...]) -> float:
    """How far from centre ``c`` along unit direction ``d`` the border of ``box`` lies (plus a little air)."""
    tx = box[2] / 2 / abs(d[0]) if d[0] else float("inf")
    ty = box[3] / 2 / abs(d[1]) if d[1] else float("inf")
    return min(tx, ty) + 6


def _wait_for_layout(g: nx.DiGraph, width: float, ry: float, lift: float) -> tuple[dict, list]:
    """Node boxes ``{n: (x, y, w, h)}`` and edges ``[(u, v, start, end, label_box)]`` in px around (0, 0).

    Nodes lie on an ellipse of radii ``width / 2`` (less a box) and ``ry``; each arrow's label
    sits beside its arrow, ``lift`` px further out.
    """
    size = {n: _text_box(g.nodes[n]["_text"], _NODE_FONT, 8) for n in g.nodes}
    bw = max((w for w, _ in size.values()), default=0)
    rx = max(width / 2 - bw / 2 - 4, 0)
    boxes = {n: (g.nodes[n]["pos"][0] * rx, g.nodes[n]["pos"][1] * ry, *size[n]) for n in g.nodes}
    edges = []
    for u, v, d in g.edges(data=True):
        (x0, y0, *_), (x1, y1, *_) = boxes[u], boxes[v]
        length = ((x1 - x0) ** 2 + (y1 - y0) ** 2) ** 0.5 or 1.0
        ux, uy = (x1 - x0) / length, (y1 - y0) / length
        nx_, ny_ = -uy, ux  # the left of u -> v: a pair of opposite edges parts to both sides
        off = 14 if g.has_edge(v, u) else 0
        a, b = _edge_end((x0, y0), (ux, uy), boxes[u]), _edge_end((x1, y1), (-ux, -uy), boxes[v])
        start = (x0 + ux * a + nx_ * off, y0 + uy * a + ny_ * off)
        end = (x1 - ux * b + nx_ * off, y1 - uy * b + ny_ * off)
        label = None
        if d.get("_text"):
            lw, lh = _text_box(d["_text"], _EDGE_FONT, 4)
            mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
            if not off and mx * nx_ + my * ny_ < -1e-6:
                nx_, ny_ = -nx_, -ny_  # a lone edge: its label on the side away from the middle of the graph
            side = abs(nx_) * lw / 2 + abs(ny_) * lh / 2 + 8 + lift
            x = min(max(mx + nx_ * side, lw / 2 - width / 2), width / 2 - lw / 2)  # kept inside the sides
            label = (x, my + ny_ * side, lw, lh)
        edges.append((u, v, start, end, label))
    return boxes, edges


def _crowded(boxes: dict, edges: list, width: float) -> bool:
    """Whether two text boxes overlap or one reaches past the sides (``width`` wide, centred on 0)."""
    every = list(boxes.values()) + [e[4] for e in edges if e[4] is not None]
    if any(abs(b[0]) + b[2] / 2 > width / 2 for b in every):
        return True
    return any(_overlap(a, b) for i, a in enumerate(every) for b in every[i + 1 :])


def wait_for_figure(g: nx.DiGraph, width: int = 720) -> Any:
    """A plotly Figure of :func:`wait_for`, ``width`` px wide: a box per rank, ``a → b`` when a waits for b.

    Each rank's box says what it is blocked in and where (``program.py:8``; up to 4 ranks),
    each arrow what it waits for the other rank to call (up to 8 ranks); beyond, the hover
    says it. The deadlock cycle is red. Text is 16-20 px and the boxes are placed (the
    figure grows taller) so that no two texts overlap.
    ``fig.layout.meta["boxes"]`` lists every text box ``(x, y, w, h)`` in px of the plot
    area, as estimated for the layout.

    Args:
        g: a :func:`wait_for` graph.
        width: the figure's width in px.

    Returns:
        A ``plotly.graph_objects.Figure`` titled with the cycle; ``layout.meta["boxes"]`` as above.

    Example:
        >>> from simdist.visualize import run_scenario, wait_for, wait_for_figure
        >>> fig = wait_for_figure(wait_for(run_scenario("head-to-head sends")))
        >>> fig.layout.title.text, fig.layout.width
        ('wait-for graph: cycle 0 → 1 → 0', 720)
    """
    go = _go()
    g = nx.DiGraph(g)
    world = g.number_of_nodes()
    labelled = world <= 8
    for n, d in g.nodes(data=True):  # up to 4 ranks a box says all; up to 8 not where; beyond, only the rank
        lines = [f"<b>rank {n}</b>", d.get("call", "?")] + ([d["site"]] if d.get("site") else [])
        d["_text"] = "<br>".join(lines[: 3 if world <= 4 else 2 if labelled else 1])
    for u, v, d in g.edges(data=True):
        d["_text"] = f"waits for<br>{d['waits_for']}" if labelled and d.get("waits_for") else ""
    plot_w = width - 20
    pair = g.number_of_nodes() <= 2  # side by side: the labels move apart; else the ellipse also grows taller
    tries = [(ry, lift) for ry in ([0.0] if pair else range(120, 2000, 20)) for lift in range(0, 121, 6)]
    for ry, lift in tries:  # the flattest layout whose texts keep apart (else the last tried)
        boxes, edges = _wait_for_layout(g, plot_w, ry, lift)
        if not _crowded(boxes, edges, plot_w):
            break
    every = list(boxes.values()) + [e[4] for e in edges if e[4] is not None]
    low = min((b[1] - b[3] / 2 for b in every), default=0) - 6
    high = max((b[1] + b[3] / 2 for b in every), default=0) + 6
    plot_h = high - low
    cx = plot_w / 2

    def at(p: tuple[float, ...]) -> tuple[float, float]:
        return p[0] + cx, p[1] - low

    notes = []
    for u, v, start, end, label in edges:
        hot = g.edges[u, v].get("in_cycle")
        color = "#D62728" if hot else "#666666"
        (x0, y0), (x1, y1) = at(start), at(end)
        notes.append(
            dict(
                x=x1,
                y=y1,
                ax=x0,
                ay=y0,
                xref="x",
                yref="y",
                axref="x",
                ayref="y",
                text="",
                showarrow=True,
                arrowhead=2,
                arrowsize=1.3,
                arrowwidth=3 if hot else 2,
                arrowcolor=color,
            )
        )
        if label is not None:
            x, y = at(label)
            notes.append(
                dict(
                    x=x,
                    y=y,
                    text=g.edges[u, v]["_text"],
                    showarrow=False,
                    font=dict(size=_EDGE_FONT, color=color),
                    bgcolor="rgba(255,255,255,0.92)",
                    borderpad=4,
                )
            )
    for n, box in boxes.items():
        d = g.nodes[n]
        color = "#888888" if d.get("finished") else d.get("color", "#888888")
        x, y = at(box)
        notes.append(
            dict(
                x=x,
                y=y,
                text=d["_text"],
                showarrow=False,
                font=dict(size=_NODE_FONT, color="#111111"),
                bgcolor=mix(color, 0.15),
                bordercolor=color,
                borderwidth=3,
                borderpad=5,
            )
        )
    fig = go.Figure()
    nodes = list(boxes)
    fig.add_trace(
        go.Scatter(
            x=[at(boxes[n])[0] for n in nodes], y=[at(boxes[n])[1] for n in nodes], mode="markers",
            marker=dict(size=40, opacity=0), hovertext=[g.nodes[n].get("label", "") for n in nodes],
            hoverinfo="text",
        )
    )  # fmt: skip
    cycle = g.graph.get("cycle") or []
    finished = sorted(n for n, d in g.nodes(data=True) if d.get("finished"))
    title = "wait-for graph: " + (
        f"cycle {' → '.join(map(str, cycle + cycle[:1]))}"
        if cycle
        else f"no cycle; waiting for finished rank{'s' if len(finished) > 1 else ''} {', '.join(map(str, finished))}"
        if finished
        else "no cycle"
    )
    _blank_axes(fig)
    fig.update_xaxes(range=[0, plot_w], fixedrange=True)
    fig.update_yaxes(range=[0, plot_h], fixedrange=True)
    fig.update_layout(
        annotations=notes, title=dict(text=title, font=dict(size=20)), width=width, height=plot_h + 60,
        autosize=False, margin=dict(l=10, r=10, t=50, b=10),
        meta={"boxes": [(*at(b), b[2], b[3]) for b in every]},
    )  # fmt: skip
    return fig


def _ink(color: str) -> str:
    """Black or white, whichever reads better on ``color``."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#FFFFFF"


def ddp_lanes(g: DdpGantt, merge: bool = True) -> tuple[list[tuple[int, ...]], dict[DdpBar, float], int]:
    """Where the bars of :func:`ddp_gantt` go: ``(row groups, bar -> y, collective lanes per group)``.

    Each group is its backward row (at ``y = 1.6·depth'·k`` for the ``k``-th group), then
    ``depth`` collective lanes, as many as the most all-reduces any rank has in flight at
    once; an all-reduce takes the first lane free at its start, the construction bar the
    first. With ``merge``, ranks whose bars have identical labels and times share one group
    (only the first rank's bars are placed); otherwise every rank has its own.

    Args:
        g: a :func:`ddp_gantt`.
        merge: let ranks with identical bars share one row group.

    Returns:
        ``(groups, y, depth)``: the row groups (tuples of ranks), each placed bar's y, and the
        number of collective lanes per group.

    Example:
        >>> from simdist.visualize import ddp_gantt, ddp_lanes, ddp_run
        >>> groups, y, depth = ddp_lanes(ddp_gantt(ddp_run(2, [4, 8, 2], bucket_cap_mb=0.0001)))
        >>> groups, depth                          # both ranks' bars agree: one group
        ([(0, 1)], 2)
    """
    per_rank: dict[int, list[DdpBar]] = {r: [] for r in range(g.world)}
    for bar in g.bars:
        per_rank[bar.rank].append(bar)
    groups: list[tuple[int, ...]] = []
    seen: dict[tuple, int] = {}
    for r, mine in per_rank.items():
        key = tuple((b.kind, b.label, b.t_start, b.t_end) for b in mine) if merge else (r,)
        if key in seen:
            groups[seen[key]] += (r,)
        else:
            seen[key] = len(groups)
            groups.append((r,))
    lanes_of: dict[int, list[list[DdpBar]]] = {}
    for k, group in enumerate(groups):
        lanes = lanes_of[k] = []
        for bar in per_rank[group[0]]:
            if bar.kind == "backward":
                continue
            lane = next((i for i, ln in enumerate(lanes) if ln[-1].t_end <= bar.t_start), len(lanes))
            if lane == len(lanes):
                lanes.append([])
            lanes[lane].append(bar)
    depth = max((len(v) for v in lanes_of.values()), default=1)
    y: dict[DdpBar, float] = {}
    for k, group in enumerate(groups):
        top = k * (depth + 1.6)
        for bar in per_rank[group[0]]:
            if bar.kind == "backward":
                y[bar] = top
        for i, lane in enumerate(lanes_of[k]):
            for bar in lane:
                y[bar] = top + 1 + i
    return groups, y, depth


def _ranks_text(ranks: tuple[int, ...]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if list(ranks) == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def ddp_figure(
    g: DdpGantt, show_construction: bool = False, contention: Timeline | None = None, merge: bool = True
) -> Any:
    """A plotly Figure of :func:`ddp_gantt`: per rank a backward row and its all-reduce lanes (µs).

    Each gradient is a pale bar in its bucket's colour, labelled with the parameter's name;
    each bucket's all-reduce a solid bar in the same colour labelled ``bucket i``; a dashed
    line marks the end of each rank's backward. DDP's construction (the model check and
    the parameter broadcast) is one grey bar per rank when ``show_construction``, else left
    out of the time axis. With ``merge`` (and no ``contention``), ranks with identical bars
    share one row group, labelled with their ranks. With ``contention`` (the run's
    :func:`timeline`), each message that shared a link with another in flight is a red line
    between the two ranks' first collective lanes.

    Args:
        g: a :func:`ddp_gantt`.
        show_construction: draw DDP's construction as a grey bar per rank.
        contention: the run's :func:`timeline`, to mark messages that shared a link.
        merge: let ranks with identical bars share one row group.

    Returns:
        A ``plotly.graph_objects.Figure``: per bucket its all-reduce bars and its gradients' bars,
        then the end-of-backward line.

    Example:
        >>> from simdist.visualize import ddp_figure, ddp_gantt, ddp_run
        >>> fig = ddp_figure(ddp_gantt(ddp_run(2, [4, 8, 2], bucket_cap_mb=0.0001)))
        >>> [trace.name for trace in fig.data]
        ['bucket 0: 1.bias, 1.weight, 0.bias', 'bucket 0 gradients', 'bucket 1: 0.weight', 'bucket 1 gradients', 'end of backward']
    """
    go = _go()
    groups, y, depth = ddp_lanes(g, merge and contention is None)
    colors = rank_colors(max(len(g.buckets), 1))
    fig = go.Figure()
    shown = [b for b in y if show_construction or b.kind != "construction"]
    who = {group[0]: _ranks_text(group) for group in groups}

    def add_bars(sel: list[DdpBar], name: str, fill: str, line: str, group: str, legend: bool) -> None:
        if not sel:
            return
        fig.add_trace(
            go.Bar(
                base=[b.t_start * US for b in sel], x=[(b.t_end - b.t_start) * US for b in sel],
                y=[y[b] for b in sel], orientation="h", width=0.8, name=name, legendgroup=group, showlegend=legend,
                marker={"color": fill, "line": {"color": line, "width": 1.5}}, text=[b.label for b in sel],
                textposition="inside", insidetextanchor="middle", textangle=0,
                textfont={"color": _ink(fill), "size": 13},
                hovertext=[f"{who[b.rank]}: {b.label}{' gradient' if b.kind == 'backward' else ''}<br>"
                           f"{b.t_start * US:.1f}–{b.t_end * US:.1f} µs ({(b.t_end - b.t_start) * US:.1f} µs)"
                           for b in sel],
                hoverinfo="text",
            )
        )  # fmt: skip

    for bucket, color in zip(g.buckets, colors):
        group = f"bucket {bucket.index}"
        add_bars(
            [b for b in shown if b.kind == "all_reduce" and b.bucket == bucket.index],
            f"bucket {bucket.index}: {', '.join(bucket.params)}",
            color,
            color,
            group,
            True,
        )
        add_bars([b for b in shown if b.kind == "backward" and b.bucket == bucket.index],
                 f"bucket {bucket.index} gradients", mix(color, 0.3), color, group, False)  # fmt: skip
    add_bars(
        [b for b in shown if b.kind == "construction"], "DDP construction", "#D9D9D9", "#999999", "construction", True
    )
    top = {r: k * (depth + 1.6) for k, group in enumerate(groups) for r in group}
    for k, group in enumerate(groups):
        end = g.backward[group[0]][1] * US
        fig.add_shape(type="line", x0=end, x1=end, y0=top[group[0]] - 0.5, y1=top[group[0]] + depth + 0.5,
                      line={"color": "#222222", "width": 2, "dash": "dash"}, layer="below")  # fmt: skip
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line={"color": "#222222", "width": 2, "dash": "dash"},
                             name="end of backward"))  # fmt: skip
    if contention is not None and contention.contention:
        hot = {c.first for c in contention.contention} | {c.second for c in contention.contention}
        xs, ys = [], []
        for a in contention.arrows:
            if a.index in hot and a.src in top and a.dst in top:
                xs += [a.t_start * US, a.t_end * US, None]
                ys += [top[a.src] + 1, top[a.dst] + 1, None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "#D62728", "width": 1.5}, opacity=0.7,
                                 name="message that shared a link", hoverinfo="skip"))  # fmt: skip
    ticks, text = [], []
    for k, group in enumerate(groups):
        ticks += [k * (depth + 1.6), k * (depth + 1.6) + 1]
        text += [f"{_ranks_text(group)}: backward", "all-reduce"]
    font = {"size": 14, "color": INK}
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=ticks, ticktext=text, tickfont=font,
                     showgrid=False, zeroline=False)  # fmt: skip
    t0 = min((b.t_start for b in shown), default=0.0)
    t1 = max((b.t_end for b in shown), default=g.duration)
    pad = 0.02 * (t1 - t0 or 1e-6)
    fig.update_xaxes(title="virtual time (µs)", range=[(t0 - pad) * US, (t1 + pad) * US], tickfont=font,
                     title_font=font, gridcolor="#EEEEEE")  # fmt: skip
    lanes = len(groups) * (depth + 1.6)
    fig.update_layout(
        barmode="overlay", plot_bgcolor="white", height=int(max(260, 28 * lanes + 150)), font={"size": 13},
        uniformtext={"minsize": 11, "mode": "hide"}, bargap=0,
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0, "font": font},
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )  # fmt: skip
    return fig
