"""Stable colours: one per rank, one per chunk, the same in every view."""

from __future__ import annotations

import colorsys

__all__ = ["PALETTE", "rank_colors", "chunk_colors", "mix"]

PALETTE: tuple[str, ...] = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#332288",
    "#666633", "#EE3377", "#663333", "#BBBBBB", "#225555", "#DDCC77", "#882255", "#AA4499",
)  # fmt: skip
"""16 colours: Okabe-Ito's seven, then Paul Tol's colours picked greedily for the largest
smallest CIELAB distance to those already chosen (at least 25 between any two)."""


def _extra(i: int) -> str:
    """Colour ``i`` beyond the palette: golden-angle hues at two lightnesses."""
    hue = (i * 0.618033988749895) % 1.0
    light = 0.45 if i % 2 else 0.65
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.6)
    return f"#{round(r * 255):02X}{round(g * 255):02X}{round(b * 255):02X}"


def rank_colors(n: int) -> list[str]:
    """``n`` hex colours, rank ``i`` gets ``rank_colors(n)[i]``; the first 16 never change with ``n``.

    The first 16 are colour-blind friendly and pairwise distinct (see :data:`PALETTE`);
    ranks beyond 16 get golden-angle hues.

    Args:
        n: the number of ranks.

    Returns:
        ``n`` colours as ``'#RRGGBB'``.

    Example:
        >>> from simdist.visualize import rank_colors
        >>> rank_colors(3)
        ['#0072B2', '#E69F00', '#009E73']
        >>> rank_colors(40)[:3] == rank_colors(3)
        True
    """
    if n < 0:
        raise ValueError(f"n={n!r} must be non-negative")
    return [PALETTE[i] if i < len(PALETTE) else _extra(i) for i in range(n)]


def chunk_colors(n: int) -> list[str]:
    """``n`` hex colours for chunks: chunk ``i`` has rank ``i``'s colour.

    In the ring and recursive algorithms chunk ``i`` is the block that rank ``i`` owns
    (reduce_scatter leaves it there, all_gather starts it there), so one colour per index
    makes "this chunk belongs to that rank" visible across views.

    Args:
        n: the number of chunks.

    Returns:
        ``n`` colours as ``'#RRGGBB'``.

    Example:
        >>> from simdist.visualize import chunk_colors, rank_colors
        >>> chunk_colors(3) == rank_colors(3)
        True
    """
    return rank_colors(n)


def mix(color: str, fraction: float, background: str = "#FFFFFF") -> str:
    """``color`` blended toward ``background``: ``fraction`` 1 is the colour, 0 the background."""
    f = min(max(float(fraction), 0.0), 1.0)
    a = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    b = [int(background[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x * f + y * (1 - f)):02X}" for x, y in zip(a, b))
