"""DDP: how DistributedDataParallel buckets gradients and overlaps their all-reduces with backward."""

import streamlit as st
import torch
from torch import nn

import simdist
import simdist as dist
from simdist import visualize as V


def step(rank: int, widths: tuple, cap_mb: float) -> list:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers = [nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
    model = nn.Sequential(*layers)
    ddp = dist.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    x = torch.randn(8, widths[0], generator=torch.Generator().manual_seed(rank))
    ddp(x).pow(2).mean().backward()
    names = {p: n for n, p in model.named_parameters()}
    buckets = [[(names[p], p.numel() * p.element_size()) for p in b.params] for b in ddp._buckets]
    dist.destroy_process_group()
    return buckets


@st.cache_data(show_spinner=False, max_entries=32)
def run(world: int, widths: tuple, cap_mb: float):
    res = simdist.simulate(step, world, args=(widths, cap_mb), seed=0)
    return res.values[0], res.trace


st.title("DDP: gradient buckets overlapping the backward pass")
with st.sidebar:
    world = st.slider("world size", 2, 8, 2, key="ddp_world")
    layers = st.slider("layers", 2, 6, 4, key="ddp_layers")
    width = st.select_slider("width", [64, 128, 256, 512], value=256, key="ddp_width")
    cap = st.select_slider("bucket_cap_mb", [0.05, 0.25, 1.0, 25.0], value=0.25, key="ddp_cap")
widths = (width,) * (layers + 1)
buckets, trace = run(world, widths, cap)

st.subheader(f"{len(buckets)} bucket(s), in the order they are all-reduced")
st.table([{"bucket": i, "parameters": ", ".join(n for n, _ in b), "bytes": sum(s for _, s in b)}
          for i, b in enumerate(buckets)])
backward = [e for e in trace if e.rank == 0 and e.kind == "compute" and e.op == "backward"]
reduces = [e for e in trace if e.rank == 0 and e.kind == "collective" and e.op == "all_reduce"
           and backward and e.t_start >= backward[0].t_start]
end = max((e.t_end for e in backward), default=0.0)
overlap = [e for e in reduces if e.t_start < end]
m1, m2 = st.columns(2)
m1.metric("backward ends at", f"{end * 1e6:.1f} µs")
m2.metric("bucket all-reduces started during backward", f"{len(overlap)} of {len(reduces)}")
st.subheader("Timeline: backward (compute) and each bucket's all-reduce, in virtual time")
st.plotly_chart(V.timeline_figure(V.timeline(trace)), key="ddp_timeline")
st.caption("On the simulator each gradient costs a modelled backward time (1 ns per element), so a bucket's "
           "all-reduce can start while later gradients are still being computed.")
