"""The Compare page's figure and its explanations, checked against the topology and the simulator.

- every symbol in any cost formula is defined (:data:`SYMBOLS`), found by removing the
  defined symbols and looking for letters left over (not by the tokenizer under test);
- every algorithm's simulated and model curve is in the figure with its own style, and
  identical curves are drawn apart;
- the axes' ticks are few and labelled in units;
- the two_level explanation: ranks 0 and 1 share a node, the slowest pair crosses the
  uplinks; every point is above the intra-node line; priced between nodes the ring is on
  its line, and every algorithm above it has ranks of one node queueing on one uplink.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("plotly", reason="the app extra (plotly) is not installed")

from simdist.visualize import (
    CONSTANTS,
    SYMBOLS,
    coincident,
    collective_run,
    compare_algorithms,
    comparison_figure,
    formula_symbols,
    model_ratios,
    model_sides,
    size_label,
    symbol_table,
    timeline,
)

from simdist.core._topology import two_level
from simdist.algorithms import ALGORITHMS, FORMULAS, cost
from simdist.algorithms._chunks import SEGMENT_BYTES

pytestmark = pytest.mark.timeout(120)

SIZES = [1 << k for k in range(4, 23, 3)]  # the page's: 16 B to 4 MiB
PAGE_OPS = ("all_reduce", "all_gather", "broadcast")


def test_every_symbol_of_every_formula_is_defined():
    for op, table in FORMULAS.items():
        for name, formula in table.items():
            rest = formula
            for symbol in sorted(SYMBOLS, key=len, reverse=True):
                rest = rest.replace(symbol, " ")
            assert not re.search(r"[^\W\d_]", rest), f"{op}/{name}: {formula!r} leaves {rest!r}"
            used = formula_symbols(formula)
            assert set(used) <= set(SYMBOLS) and used
    assert formula_symbols("2(⌊lg p⌋+e)·α + (2(p'-1)/p' + 2e)·n·β") == ["α", "β", "n", "⌊lg p⌋", "p'", "e"]  # no bare p
    with pytest.raises(ValueError, match="lg"):
        formula_symbols("lg p·α")


@pytest.mark.parametrize("op", PAGE_OPS)
def test_the_symbol_table_defines_what_the_formulas_use_with_values(op):
    cmp = compare_algorithms(op, 6, [16, 1 << 20], "two_level")
    rows = {r["symbol"]: r for r in symbol_table(cmp)}
    for c in cmp.curves:
        assert set(formula_symbols(c.formula)) <= set(rows)
    assert rows["p"]["value here"] == "6"
    assert rows["α"]["value here"] == "1 µs (ranks 0 and 1)"  # two 0.5 µs links inside node 0
    assert rows["β"]["value here"] == "0.01 ns/B, i.e. 100 GB/s (ranks 0 and 1)"
    far = {r["symbol"]: r["value here"] for r in symbol_table(cmp, slowest=True)}
    assert far["α"] == "3 µs (ranks 0 and 4)" and far["β"] == "0.08 ns/B, i.e. 12.5 GB/s (ranks 0 and 4)"
    if "p'" in rows:
        assert rows["p'"]["value here"] == "4" and rows["e"]["value here"] == "1"
    if "⌈lg p⌉" in rows:
        assert rows["⌈lg p⌉"]["value here"] == "3"


def test_sizes_are_labelled_in_binary_units():
    assert [size_label(n) for n in SIZES] == ["16 B", "128 B", "1 KiB", "8 KiB", "64 KiB", "512 KiB", "4 MiB"]
    assert size_label(1536) == "1.5 KiB" and size_label(0) == "0 B"


@pytest.mark.parametrize("topology", ["switch", "two_level"])
@pytest.mark.parametrize("op", PAGE_OPS)
def test_every_curve_is_in_the_figure_with_its_own_style_and_readable_ticks(op, topology):
    cmp = compare_algorithms(op, 8, SIZES, topology)
    fig = comparison_figure(cmp)
    sims = {t.name: t for t in fig.data if t.name in ALGORITHMS[op]}
    models = {t.name: t for t in fig.data if t.name.endswith(" (model)")}
    assert set(sims) == set(ALGORITHMS[op]) and set(models) == {f"{a} (model)" for a in ALGORITHMS[op]}
    styles = {(t.line.color, t.marker.symbol, t.line.dash) for t in sims.values()}
    assert len(styles) == len(sims) == len({t.line.color for t in sims.values()})
    for c in cmp.curves:
        assert list(sims[c.algorithm].y) == pytest.approx([t * 1e6 for t in c.simulated])
        assert list(models[f"{c.algorithm} (model)"].y) == pytest.approx([t * 1e6 for t in c.model])
    for group in coincident(cmp):  # identical curves: drawn apart, each at its own x
        xs = [tuple(sims[a].x) for a in group]
        assert len(set(xs)) == len(group)
    shown = [(tuple(t.x), tuple(t.y)) for t in sims.values()]
    assert len(set(shown)) == len(shown), "two curves drawn on top of each other"
    x, y = fig.layout.xaxis, fig.layout.yaxis
    assert list(x.ticktext) == [size_label(n) for n in x.tickvals] and len(x.tickvals) <= 8
    assert 3 <= len(y.tickvals) <= 7 and all(re.fullmatch(r"[\d.]+ (ns|µs|ms|s)", t) for t in y.ticktext)


def test_ring_and_ring_pipelined_coincide_on_the_switch_and_are_drawn_apart():
    cmp = compare_algorithms("all_reduce", 8, SIZES, "switch")
    assert ("ring", "ring_pipelined", "hierarchical") in coincident(
        cmp
    )  # one machine: hierarchical is the pipelined ring
    ring, pipe = (next(c for c in cmp.curves if c.algorithm == a) for a in ("ring", "ring_pipelined"))
    assert ring.simulated == pipe.simulated
    fig = comparison_figure(cmp)
    xr, xp = (next(t for t in fig.data if t.name == a).x for a in ("ring", "ring_pipelined"))
    assert list(xr) == SIZES and all(1.05 < p / r < 1.3 for r, p in zip(xr, xp))


def test_two_level_alpha_beta_are_intra_node_and_the_slowest_pair_crosses_the_uplinks():
    topo = two_level(8)
    cmp = compare_algorithms("all_gather", 8, [1 << 20], "two_level")
    assert (cmp.alpha, cmp.beta) == pytest.approx((2 * 0.5e-6, 1 / 100e9))  # rank - node0 - rank
    assert cmp.slowest == (0, 4)
    assert (cmp.slowest_alpha, cmp.slowest_beta) == pytest.approx((2 * 0.5e-6 + 2 * 1e-6, 1 / 12.5e9))
    assert cmp.slowest_beta / cmp.beta == pytest.approx(8)
    uplink = ("node0", "spine")
    assert all(uplink in topo.path(r, 4 + r)[0] for r in range(4))  # the 4 ranks of node 0 share one uplink
    assert all(uplink not in topo.path(0, r)[0] for r in range(1, 4))
    for c in cmp.curves:
        assert c.model_slowest == (cost("all_gather", c.algorithm, 1 << 20, 8, 3e-6, 1 / 12.5e9),)


@pytest.mark.parametrize("world", [6, 8, 12])
def test_two_level_points_are_above_the_intra_node_lines(world):
    for op in PAGE_OPS:
        cmp = compare_algorithms(op, world, SIZES, "two_level")
        for algorithm, (lo, _) in model_ratios(cmp).items():
            assert lo > 1.1, f"{op}/{algorithm} at {world} ranks: a point {lo:.2f}× its line"


def uplink_queueing(op: str, algorithm: str, world: int) -> int:
    """Pairs of messages from different ranks in flight on one uplink at once, at 1 MiB."""
    res = collective_run(op, algorithm, world, 1 << 20, "two_level", record_steps=False)
    tl = timeline(res.trace, "two_level")
    return sum(1 for c in tl.contention if "spine" in c.link and tl.arrows[c.first].src != tl.arrows[c.second].src)


@pytest.mark.parametrize("world", [6, 8, 12])
def test_priced_between_nodes_the_ring_is_on_its_line_and_the_ones_above_share_an_uplink(world):
    for op in ("all_reduce", "all_gather"):
        cmp = compare_algorithms(op, world, SIZES, "two_level")
        above, below, on = model_sides(cmp, slowest=True)
        assert "ring" in on
        ring = next(c for c in cmp.curves if c.algorithm == "ring")
        assert [s / m for s, m in zip(ring.simulated[1:], ring.model_slowest[1:])] == pytest.approx(
            [1.0] * (len(SIZES) - 1), rel=1e-3
        )  # from 128 B up
        assert uplink_queueing(op, "ring", world) == 0
        for algorithm in above:
            assert uplink_queueing(op, algorithm, world) > 0, f"{op}/{algorithm} is above without queueing"
        for algorithm in below:  # some messages stay inside a node (ranks 4k .. 4k+3)
            res = collective_run(op, algorithm, world, 1 << 20, "two_level", record_steps=False)
            assert any(e.rank // 4 == e.peer // 4 for e in res.trace if e.kind == "message")
        assert set(above) | set(below) | set(on) == set(ALGORITHMS[op])
    at8 = model_sides(compare_algorithms("all_reduce", 8, SIZES, "two_level"), slowest=True)[0]
    if world == 8:
        assert set(at8) == {"recursive_doubling", "rabenseifner"}


def test_on_the_switch_every_point_is_within_1_percent_of_its_line_from_128_bytes():
    for op in PAGE_OPS:
        cmp = compare_algorithms(op, 8, SIZES, "switch")
        assert (cmp.alpha, cmp.beta) == (cmp.slowest_alpha, cmp.slowest_beta)
        for c in cmp.curves:
            assert [s / m for s, m in zip(c.simulated[1:], c.model[1:])] == pytest.approx([1.0] * 6, rel=0.01)


@pytest.mark.parametrize("world", [6, 8])
def test_on_the_ring_topology_the_algorithms_off_their_line_send_between_non_neighbours(world):
    for op in PAGE_OPS:
        cmp = compare_algorithms(op, world, SIZES, "ring")
        assert cmp.slowest == (0, world // 2) and cmp.slowest_alpha == pytest.approx(world // 2 * cmp.alpha)
        for algorithm, (lo, hi) in model_ratios(cmp).items():
            res = collective_run(op, algorithm, world, 1 << 16, "ring", record_steps=False)
            far = [e for e in res.trace if e.kind == "message" and (e.peer - e.rank) % world not in (1, world - 1)]
            if max(abs(lo - 1), abs(hi - 1)) > 0.01:
                assert far, f"{op}/{algorithm} is off its line but only talks to neighbours"


@pytest.mark.parametrize("op", PAGE_OPS)
def test_every_letter_a_meaning_names_has_a_row_of_its_own(op):
    """A symbol's meaning may name a constant (S: ``⌈n / (p·s)⌉``): the table gives it a row with its value,
    and no value hides one in parentheses."""
    cmp = compare_algorithms(op, 8, [16, 1 << 20, 4 << 20], "switch")
    rows = {r["symbol"]: r for r in symbol_table(cmp)}
    for symbol, row in rows.items():
        formulas = " ".join(re.findall(r"⌈([^⌉]*)⌉", row["meaning"]))  # the meaning's formulas: ⌈n / (p·s)⌉
        named = set(re.findall(r"(?<![A-Za-z])([a-z])(?![A-Za-z])", formulas))
        assert named <= set(rows) | {"p", "n"}, (symbol, row["meaning"], sorted(rows))
        assert " = " not in row["value here"], row
    for constant, (user, _) in CONSTANTS.items():
        assert (constant in rows) == (user in rows)
    if "S" in rows:
        assert rows["s"]["value here"] == size_label(SEGMENT_BYTES)


def test_simulated_curves_are_solid_and_only_the_model_lines_dashed():
    """The legend's "model (thin dashed)" is the only dashed kind of line: simulated curves differ by colour and
    marker, drawn solid and thicker."""
    fig = comparison_figure(compare_algorithms("all_reduce", 8, [16, 1 << 20], "switch"))
    simulated = [t for t in fig.data if t.mode == "lines+markers"]
    model = [t for t in fig.data if t.mode == "lines"]
    assert simulated and {t.line.dash for t in simulated} == {"solid"}
    assert {t.line.dash for t in model} == {"dash"} and "model (thin dashed)" in [t.name for t in model]
    assert min(t.line.width for t in simulated) > max(t.line.width for t in model)
    assert len({t.marker.symbol for t in simulated}) == len(simulated)
