"""DDP: how DistributedDataParallel buckets gradients and overlaps their all-reduces with backward."""

import streamlit as st

from simdist import visualize as V


@st.cache_data(show_spinner=False, max_entries=32)
def run(world: int, widths: tuple, cap: float) -> V.DdpRun:
    return V.ddp_run(world, widths, cap)


st.title("DDP: gradient buckets overlapping the backward pass")
with st.sidebar:
    world = st.slider("world size", 2, 8, 2, key="ddp_world")
    layers = st.slider("layers", 2, 6, 4, key="ddp_layers")
    width = st.select_slider("width", [64, 128, 256, 512], value=256, key="ddp_width")
    cap = st.select_slider("bucket_cap_mb", [0.05, 0.25, 1.0, 25.0], value=0.25, key="ddp_cap")
    show_construction = st.checkbox("show DDP construction (parameter broadcast)", False, key="ddp_construction")
    separate = st.checkbox("one row group per rank (even when ranks are identical)", False, key="ddp_separate")
    show_contention = st.checkbox("show link contention (red lines; one group per rank)", False, key="ddp_contention")
widths = (width,) * (layers + 1)
ddp = run(world, widths, cap)
gantt = V.ddp_gantt(ddp)

start, end = gantt.backward[0]
reduces = [b for b in gantt.bars if b.rank == 0 and b.kind == "all_reduce"]
built = next((b for b in gantt.bars if b.rank == 0 and b.kind == "construction"), None)
counts = set(gantt.overlapped.values())
m1, m2, m3 = st.columns(3)
m1.metric("rank 0's backward", f"{start * 1e6:.1f} – {end * 1e6:.1f} µs")
m2.metric("rank 0's last all-reduce ends", f"{max(b.t_end for b in reduces) * 1e6:.1f} µs")
m3.metric(
    "all-reduces started in backward",
    f"{gantt.overlapped[0]} of {len(reduces)}",
    help="On rank 0: bucket all-reduces that started before rank 0's last gradient was computed"
    + ("" if len(counts) == 1 else f"; other ranks: {sorted(counts)}"),
)

st.subheader("Gradients (pale) and bucket all-reduces (solid), in virtual time")
timeline = V.timeline(ddp.trace) if show_contention else None
st.plotly_chart(V.ddp_figure(gantt, show_construction, timeline, merge=not separate), key="ddp_gantt")
groups = V.ddp_lanes(gantt, merge=not (separate or show_contention))[0]
notes = (
    []
    if len(groups) == world
    else ["Ranks whose every bar has the same times share one row group (tick 'one row group per rank' to see each)."]
)
notes.append(
    "Backward produces gradients from the last layer to the first; DDP all-reduces a bucket as soon as all "
    "of its gradients are ready, so a bucket's all-reduce (solid) runs while later gradients (pale, same "
    "colour as their bucket) are still being computed. On the simulator each gradient costs 1 ns per "
    "element, so a bias takes a sliver next to its weight."
)
if built is not None and not show_construction:
    notes.append(
        f"Not drawn: DDP's construction on rank 0, {built.t_start * 1e6:.1f} – {built.t_end * 1e6:.1f} µs "
        f"({gantt.construction[0].get('all_gather', 0)} all_gather to check that every rank holds the "
        f"same model, {gantt.construction[0].get('broadcast', 0)} broadcast of the parameters from "
        "rank 0). Tick 'show DDP construction' to include it."
    )
if show_contention and timeline is not None:
    notes.append(
        f"Red: the messages of the {len(timeline.contention)} pairs that were on one link at once (the later "
        "one queued behind the earlier one's bytes, or followed right behind them), from sender to receiver."
    )
st.caption(" ".join(notes))

st.subheader(f"{len(ddp.buckets)} bucket(s), in the order they are all-reduced")
st.table([{"bucket": b.index, "parameters": ", ".join(b.params), "bytes": b.nbytes} for b in ddp.buckets])
