"""The DDP Gantt chart against its trace: each bucket's all-reduce, each gradient, the overlap count.

The truth each test checks comes from somewhere other than ``ddp_gantt``'s own reading:
bucket sizes from the layers' shapes, a gradient's duration from DDP's modelled cost
(``BACKWARD_SECONDS_PER_ELEMENT`` per element), the overlap count from the order in which
gradients became ready and the buckets' contents (no times at all).
"""

from __future__ import annotations

import pytest

pytest.importorskip("plotly", reason="the app extra (plotly) is not installed")

from simdist.visualize import ddp_figure, ddp_gantt, ddp_lanes, ddp_run, timeline

from simdist._ddp import BACKWARD_SECONDS_PER_ELEMENT

pytestmark = pytest.mark.timeout(120)

WIDTHS = (32, 48, 64, 80)  # three layers of different sizes: every bucket has its own byte count
CAP_MB = 0.001  # about 1 KB: a bucket closes at each layer's weight, so one bucket per layer
US = 1e6


def numel(name: str) -> int:
    """Elements of ``'i.weight'`` / ``'i.bias'`` of ``Linear(WIDTHS[i], WIDTHS[i+1])``."""
    layer, kind = name.split(".")
    a, b = WIDTHS[int(layer)], WIDTHS[int(layer) + 1]
    return a * b if kind == "weight" else b


@pytest.fixture(scope="module", params=[2, 8])
def run(request):
    return ddp_run(request.param, WIDTHS, CAP_MB)


def figure_bars(fig, groups, depth, name_prefix: str) -> dict[int, list[tuple[str, float, float, str]]]:
    """rank -> (trace name, start µs, end µs, text) of every bar whose trace name starts with ``name_prefix``."""
    out: dict[int, list] = {}
    for tr in fig.data:
        if tr.type != "bar" or not tr.name.startswith(name_prefix):
            continue
        for base, width, y, text in zip(tr.base, tr.x, tr.y, tr.text):
            group = groups[int((y + 0.5) // (depth + 1.6))]
            for r in group:
                out.setdefault(r, []).append((tr.name, base, base + width, text))
    return out


def test_buckets_are_the_layers_in_reverse(run):
    expected = [(f"{i}.bias", f"{i}.weight") for i in reversed(range(len(WIDTHS) - 1))]
    assert [b.params for b in run.buckets] == expected
    assert [b.nbytes for b in run.buckets] == [4 * sum(numel(n) for n in b) for b in expected]
    assert len({b.nbytes for b in run.buckets}) == len(run.buckets)


def test_each_buckets_all_reduce_span_in_the_figure_is_its_collective_in_the_trace(run):
    g = ddp_gantt(run)
    fig = ddp_figure(g, merge=False)
    groups, _, depth = ddp_lanes(g, merge=False)
    assert groups == [(r,) for r in range(run.world)]
    drawn = figure_bars(fig, groups, depth, "bucket ")
    for b in run.buckets:
        for r in range(run.world):
            # the trace's own events for this bucket: the all-reduce of exactly the bucket's size
            events = [
                e
                for e in run.trace
                if e.rank == r and e.kind == "collective" and e.op == "all_reduce" and e.nbytes == b.nbytes
            ]
            assert len(events) == 1
            bars = [x for x in drawn[r] if x[3] == f"bucket {b.index}"]
            assert len(bars) == 1
            _, start, end, _ = bars[0]
            assert start == pytest.approx(events[0].t_start * US, abs=1e-9)
            assert end == pytest.approx(events[0].t_end * US, abs=1e-9)
        ids = {bar.collective_id for bar in g.bars if bar.bucket == b.index and bar.kind == "all_reduce"}
        assert len(ids) == 1, "every rank's bar of one bucket is the same collective"


def test_each_gradient_bar_is_a_backward_event_of_the_parameters_modelled_cost(run):
    g = ddp_gantt(run)
    fig = ddp_figure(g, merge=False)
    groups, _, depth = ddp_lanes(g, merge=False)
    drawn = figure_bars(fig, groups, depth, "bucket ")
    names = {n for b in run.buckets for n in b.params}
    for r in range(run.world):
        grads = [x for x in drawn[r] if x[3] in names]
        assert sorted(x[3] for x in grads) == sorted(names)
        events = sorted(
            (e.t_start * US, e.t_end * US)
            for e in run.trace
            if e.rank == r and e.kind == "compute" and e.op == "backward"
        )
        spans = sorted((s, e) for _, s, e, _ in grads)
        assert [x for span in spans for x in span] == pytest.approx([x for span in events for x in span], abs=1e-9)
        for trace_name, start, end, name in grads:
            assert end - start == pytest.approx(numel(name) * BACKWARD_SECONDS_PER_ELEMENT * US, rel=1e-6)
            bucket = next(b for b in run.buckets if name in b.params)
            assert trace_name == f"bucket {bucket.index} gradients"


def overlap_from_the_gradient_order(run, rank: int) -> int:
    """Buckets launched before the last gradient: DDP launches bucket i once buckets 0..i are complete."""
    position = {n: i for i, n in enumerate(run.ready[rank])}
    last = len(position) - 1
    launched_at = 0
    count = 0
    for b in run.buckets:
        launched_at = max(launched_at, *(position[n] for n in b.params))
        count += launched_at < last
    return count


def test_the_overlap_count_equals_a_count_from_the_gradient_order(run):
    g = ddp_gantt(run)
    for r in range(run.world):
        assert g.overlapped[r] == overlap_from_the_gradient_order(run, r) == len(run.buckets) - 1
        start, end = g.backward[r]
        computed = [e for e in run.trace if e.rank == r and e.kind == "compute"]
        assert (start, end) == (min(e.t_start for e in computed), max(e.t_end for e in computed))


def test_one_big_bucket_starts_after_backward():
    run = ddp_run(2, WIDTHS, 25.0)
    g = ddp_gantt(run)
    assert len(run.buckets) == 1 and g.overlapped == {0: 0, 1: 0} == {
        r: overlap_from_the_gradient_order(run, r) for r in range(2)
    }


def test_construction_is_labelled_and_left_out_unless_asked(run):
    g = ddp_gantt(run)
    params = 2 * (len(WIDTHS) - 1)
    for r in range(run.world):
        assert g.construction[r]["broadcast"] == params  # every parameter, from rank 0
        built = [e for e in run.trace if e.rank == r and e.kind == "collective" and e.op != "all_reduce"]
        bar = next(b for b in g.bars if b.rank == r and b.kind == "construction")
        assert (bar.t_start, bar.t_end) == (min(e.t_start for e in built), max(e.t_end for e in built))
        assert bar.t_end <= g.backward[r][0] and "construction" in bar.label
    hidden = ddp_figure(g)
    assert not [t for t in hidden.data if "construction" in (t.name or "")]
    assert hidden.layout.xaxis.range[0] > bar.t_start * US  # the time axis starts near backward
    shown = ddp_figure(g, show_construction=True)
    (trace,) = [t for t in shown.data if t.name == "DDP construction"]
    assert all("model check + parameter broadcast" in text for text in trace.text)


def test_identical_ranks_share_a_row_group_and_contention_is_off_by_default(run):
    g = ddp_gantt(run)
    same = all(
        sorted(
            (e.kind, e.op, e.t_start, e.t_end) for e in run.trace if e.rank == r and e.kind in ("compute", "collective")
        )
        == sorted(
            (e.kind, e.op, e.t_start, e.t_end) for e in run.trace if e.rank == 0 and e.kind in ("compute", "collective")
        )
        for r in range(run.world)
    )
    groups, _, _ = ddp_lanes(g)
    assert (groups == [tuple(range(run.world))]) == same
    assert not [t for t in ddp_figure(g).data if t.name == "message that shared a link"]
    tl = timeline(run.trace)
    with_red = ddp_figure(g, contention=tl)
    red = [t for t in with_red.data if t.name == "message that shared a link"]
    hot = {c.first for c in tl.contention} | {c.second for c in tl.contention}
    assert bool(red) == bool(hot)
    if red:
        assert len(red[0].x) == 3 * len(hot)
        assert ddp_lanes(g, merge=False)[0] == [(r,) for r in range(run.world)]


@pytest.mark.parametrize("kwargs, match", [
    ({"world": 1, "widths": WIDTHS, "bucket_cap_mb": 1.0}, "world=1"),
    ({"world": 2, "widths": (8,), "bucket_cap_mb": 1.0}, r"widths=\(8,\)"),
    ({"world": 2, "widths": (8, 0), "bucket_cap_mb": 1.0}, r"widths=\(8, 0\)"),
    ({"world": 2, "widths": WIDTHS, "bucket_cap_mb": 0}, "bucket_cap_mb=0"),
])  # fmt: skip
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ddp_run(**kwargs)
