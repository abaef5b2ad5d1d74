"""simdist visualizer: ``streamlit run app.py``.

A thin shell: pick a collective, a world size and a seed; the page runs it on the
simulator (``simdist.simulate``) and shows the messages of the trace and the trace in
Chrome/Perfetto JSON. Everything it draws comes from the trace; the views themselves
belong in ``simdist.visualize``.
"""

from __future__ import annotations

import torch
import streamlit as st

import simdist
import simdist as dist
from simdist.algorithms import ALGORITHMS

OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter",
       "barrier"]


def program(rank: int, world_size: int, op: str, n: int, algorithm: str | None):
    """One rank of a single collective on ``n`` float32 elements per rank; returns the rank's result."""
    dist.init_process_group("sim", rank=rank, world_size=world_size)
    kw = {"algorithm": algorithm} if algorithm else {}
    x = torch.arange(n, dtype=torch.float32) + 100 * rank
    if op in ("all_reduce", "broadcast", "reduce"):
        if op == "all_reduce":
            dist.all_reduce(x, **kw)
        elif op == "broadcast":
            dist.broadcast(x, src=0, **kw)
        else:
            dist.reduce(x, dst=0, **kw)
        out = x.tolist()
    elif op == "all_gather":
        outs = [torch.zeros(n) for _ in range(world_size)]
        dist.all_gather(outs, x, **kw)
        out = [t.tolist() for t in outs]
    elif op in ("reduce_scatter", "all_to_all"):
        ins = [x + 10 * i for i in range(world_size)]
        if op == "reduce_scatter":
            res = torch.zeros(n)
            dist.reduce_scatter(res, ins, **kw)
            out = res.tolist()
        else:
            outs = [torch.zeros(n) for _ in range(world_size)]
            dist.all_to_all(outs, ins, **kw)
            out = [t.tolist() for t in outs]
    elif op == "gather":
        outs = [torch.zeros(n) for _ in range(world_size)] if rank == 0 else None
        dist.gather(x, outs, dst=0, **kw)
        out = [t.tolist() for t in outs] if outs else None
    elif op == "scatter":
        ins = [torch.full((n,), float(i)) for i in range(world_size)] if rank == 0 else None
        res = torch.zeros(n)
        dist.scatter(res, ins, src=0, **kw)
        out = res.tolist()
    else:
        dist.barrier(**kw)
        out = None
    dist.destroy_process_group()
    return out


@st.cache_data(show_spinner=False)
def run(op: str, world_size: int, seed: int, n: int, algorithm: str | None, detail: str, topology: str):
    res = simdist.simulate(program, world_size, args=(world_size, op, n, algorithm), seed=seed, detail=detail,
                           topology=topology)
    messages = [
        {"src": e.rank, "dst": e.peer, "op": e.op, "algorithm": e.algorithm, "step": e.step, "chunk": e.chunk,
         "bytes": e.nbytes, "start (µs)": round(e.t_start * 1e6, 4), "end (µs)": round(e.t_end * 1e6, 4)}
        for e in res.trace.of_kind("message")
    ]
    return res.values, messages, res.trace.to_chrome_json(), res.schedule, res.time, res.points


st.set_page_config(page_title="simdist", layout="wide")
st.title("simdist: collectives on a deterministic simulator")

with st.sidebar:
    op = st.selectbox("collective", OPS)
    world_size = st.slider("world size", 1, 16, 4)
    seed = int(st.number_input("seed", min_value=0, value=0, step=1))
    n = st.slider("elements per rank (float32)", 1, 64, 4)
    algorithm = st.selectbox("algorithm", ["automatic", *ALGORITHMS[op]])
    detail = st.radio("detail", ["messages", "collectives"])
    topologies = sorted(simdist.TOPOLOGIES)
    topology = st.selectbox("topology", topologies, index=topologies.index("switch"))

try:
    values, messages, chrome, token, makespan, points = run(
        op, world_size, seed, n, None if algorithm == "automatic" else algorithm, detail, topology)
except simdist.DistError as err:
    st.error(f"{type(err).__name__}")
    st.code(str(err))
    st.stop()

c1, c2, c3, c4 = st.columns(4)
c1.metric("messages", len(messages))
c2.metric("virtual time", f"{makespan * 1e6:.3f} µs")
c3.metric("scheduling points", points)
c4.metric("replay token", token)

st.subheader("Messages")
st.dataframe(messages)

st.subheader("Results by rank")
st.dataframe([{"rank": r, "result": str(v)} for r, v in enumerate(values)])

st.download_button("Download trace (Chrome/Perfetto JSON)", chrome, file_name=f"simdist_{op}_{world_size}.json",
                   mime="application/json")
st.caption("Open the JSON at ui.perfetto.dev or chrome://tracing: one lane per rank, an arrow per message.")
