"""Plotly figures of the views (plotly is imported inside each builder: it is the app extra's)."""

from __future__ import annotations

from typing import Any

import networkx as nx

from ._buffers import BufferTable
from ._colors import chunk_colors, mix, rank_colors
from ._compare import Comparison
from ._timeline import Timeline

__all__ = ["graph_figure", "buffer_figure", "timeline_figure", "comparison_figure", "wait_for_figure"]

US = 1e6  # figures show microseconds


def _go() -> Any:
    import plotly.graph_objects as go

    return go


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
            text=[str(n) for n in nodes], textfont=dict(color="white", size=11 if world <= 8 else 9),
            hovertext=[f"rank {n}: sent {g.nodes[n]['sent']}, received {g.nodes[n]['received']}" for n in nodes],
            hoverinfo="text",
        )
    )  # fmt: skip
    title = f"round {g.graph.get('step')}" + (f" of {g.graph['rounds']}" if g.graph.get("rounds") else "")
    if g.graph.get("op"):
        title = f"{g.graph['op']} ({g.graph.get('algorithm')}), {title}"
    fig.update_layout(title=title)
    _blank_axes(fig)
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


def buffer_figure(table: BufferTable) -> Any:
    """A plotly Figure of :func:`buffer_table`: one row per rank, one cell per leading value.

    Reduced data (all_reduce, reduce, reduce_scatter) is coloured by chunk, paler while
    fewer ranks' inputs are summed in (the text says how many); moved data is coloured
    by the rank it came from. Rows rebuilt from the inputs are marked.
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
            text=text, texttemplate="%{text}" if width <= 24 else "", textfont=dict(size=9), hovertext=hover,
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
    fig.update_layout(title=f"{name} {when}", plot_bgcolor="white",
                      height=max(200, 28 * len(table.rows) + 80), margin=dict(l=10, r=10, t=40, b=10))  # fmt: skip
    return fig


def timeline_figure(tl: Timeline) -> Any:
    """A plotly Figure of :func:`timeline`: a lane per rank (µs), each message an arrow from sender to receiver.

    Span bars are coloured by rank; messages in their sender's colour; messages that
    shared a link in flight (contention) are drawn thick and red.
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
                hoverinfo="text", name=f"rank {r}",
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
    fig.update_yaxes(autorange="reversed", tickmode="array", tickvals=list(range(tl.world)),
                     ticktext=[f"rank {r}" for r in range(tl.world)])  # fmt: skip
    fig.update_xaxes(title="virtual time (µs)")
    title = f"timeline on {tl.topology}: {len(tl.arrows)} messages"
    if tl.contention:
        title += f", {len(tl.contention)} link conflicts"
    fig.update_layout(title=title, barmode="overlay", plot_bgcolor="white", height=max(250, 26 * tl.world + 100),
                      margin=dict(l=10, r=10, t=40, b=10), showlegend=bool(tl.contention))  # fmt: skip
    return fig


def comparison_figure(cmp: Comparison) -> Any:
    """A plotly Figure of :func:`compare_algorithms`: time (µs) against size (log-log).

    Each algorithm: the simulated curve (solid, markers) and its alpha-beta formula's
    prediction (dashed, the formula in the legend); dotted lines mark simulated crossovers.
    """
    go = _go()
    colors = rank_colors(len(cmp.curves))
    fig = go.Figure()
    for c, color in zip(cmp.curves, colors):
        fig.add_trace(
            go.Scatter(
                x=list(cmp.sizes),
                y=[t * US for t in c.simulated],
                mode="lines+markers",
                name=f"{c.algorithm} (simulated)",
                line=dict(color=color),
                legendgroup=c.algorithm,
            )
        )
        fig.add_trace(go.Scatter(x=list(cmp.sizes), y=[t * US for t in c.model], mode="lines",
                                 name=f"{c.algorithm} model: {c.formula}", line=dict(color=color, dash="dash"),
                                 legendgroup=c.algorithm))  # fmt: skip
    for x in cmp.crossovers:
        at = (x.below * x.above) ** 0.5 if x.below > 0 else x.above
        fig.add_vline(x=at, line=dict(color="#888888", dash="dot"), annotation_text=f"{x.before} → {x.after}",
                      annotation_textangle=-90)  # fmt: skip
    fig.update_xaxes(type="log", title="bytes")
    fig.update_yaxes(type="log", title="virtual time (µs)")
    fig.update_layout(title=f"{cmp.op} on {cmp.world} ranks ({cmp.topology}; α = {cmp.alpha * US:g} µs, "
                            f"β = {cmp.beta * 1e9:g} ns/B)", plot_bgcolor="white",
                      margin=dict(l=10, r=10, t=40, b=10))  # fmt: skip
    return fig


def wait_for_figure(g: nx.DiGraph) -> Any:
    """A plotly Figure of :func:`wait_for`: blocked ranks on a circle, ``a → b`` when a waits for b.

    Edges of the deadlock cycle are red; each rank's label says what it is blocked in and where.
    """
    go = _go()
    fig = go.Figure()
    pos = {n: d["pos"] for n, d in g.nodes(data=True)}
    notes = []
    for u, v, d in g.edges(data=True):
        a, b = _shorten(pos[u], pos[v], 0.1)
        hot = d.get("in_cycle")
        notes.append(dict(
            x=b[0], y=b[1], ax=a[0], ay=a[1], xref="x", yref="y", axref="x", ayref="y", showarrow=True,
            arrowhead=2, arrowwidth=2.5 if hot else 1.2, arrowcolor="#D62728" if hot else "#888888",
        ))  # fmt: skip
    nodes = list(g.nodes)
    fig.add_trace(
        go.Scatter(
            x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers+text",
            marker=dict(size=26, color=[g.nodes[n]["color"] for n in nodes]), text=[str(n) for n in nodes],
            textfont=dict(color="white"), hovertext=[g.nodes[n]["label"] for n in nodes], hoverinfo="text",
        )
    )  # fmt: skip
    for n in nodes:
        x, y = pos[n]
        notes.append(dict(x=x * 1.25, y=y * 1.25 - 0.05, text=g.nodes[n]["label"], showarrow=False,
                          font=dict(size=10)))  # fmt: skip
    fig.update_layout(annotations=notes)
    cycle = g.graph.get("cycle") or []
    fig.update_layout(title="wait-for graph" + (f": cycle {' → '.join(map(str, cycle + cycle[:1]))}" if cycle else ""))
    _blank_axes(fig)
    fig.update_xaxes(range=[-2, 2])
    return fig
