"""Collectives: pick a collective, an algorithm, a world size, a size and a topology; step through it."""

import time

import streamlit as st

from simdist import visualize as V
from simdist.algorithms import ALGORITHMS

OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"]
SIZES = {"64 B": 64, "128 B": 128, "512 B": 512, "4 KiB": 4096, "64 KiB": 64 << 10, "1 MiB": 1 << 20}


@st.cache_data(show_spinner=False, max_entries=64)
def run(op: str, algorithm: str, world: int, nbytes: int, topology: str):
    res = V.collective_run(op, algorithm, world, nbytes, topology=topology)
    return res.trace, res.schedule


st.title("Collectives, step by step")
with st.sidebar:
    op = st.selectbox("collective", OPS, key="op")
    algorithms = list(ALGORITHMS[op])
    default = algorithms.index("ring") if "ring" in algorithms else 0
    algorithm = st.selectbox("algorithm", algorithms, index=default, key="algorithm")
    world = st.slider("world size", 2, 16, 8, key="world")
    size = st.select_slider("message size", list(SIZES), value="512 B", key="size")
    names = V.topology_choices()
    topology = st.selectbox("topology", names, key="topology")

trace, token = run(op, algorithm, world, SIZES[size], topology)
last = len(V.steps(trace))  # rounds 1 .. last; last + 1 shows the result
if st.session_state.get("config") != (op, algorithm, world, size, topology):
    st.session_state.config = (op, algorithm, world, size, topology)
    st.session_state.step = 1  # a new run opens at its first round
    st.session_state.playing = False


def move(by: int) -> None:  # a button's callback: runs before the page, so every button is drawn for the new round
    st.session_state.step += by


def play() -> None:
    st.session_state.step, st.session_state.playing = 1, True


c1, c2, c3, c4 = st.columns([1, 1, 1, 4])
c1.button("◀ previous", disabled=st.session_state.step <= 1, on_click=move, args=(-1,))
c2.button("next ▶", disabled=st.session_state.step > last, on_click=move, args=(1,))
c3.button("▶ play", disabled=st.session_state.playing, on_click=play)
step = st.session_state.step
c4.progress(min(step, last) / max(last, 1), text=f"round {step} of {last}" if step <= last else "result")

table = V.buffer_table(trace, step if step <= last else None)
scratch = any(r.source == "work" for r in V.buffer_table(trace, last).rows)
left, right = st.columns(2)
with left:
    if step <= last:
        g = V.step_graph(trace, step, topology=topology)
        n = g.number_of_edges()
        st.subheader(f"Round {step} of {last}: {n} message{'s' if n != 1 else ''}")
        st.plotly_chart(V.graph_figure(g), key="graph")
    elif scratch and op == "reduce_scatter":
        st.subheader("Done: each rank keeps its own block's sum (a local copy, no messages)")
    elif scratch:
        st.subheader("Done: each rank rotates its blocks into place (local, no messages)")
    else:
        st.subheader("Done: every rank holds its result")
    st.caption(
        "A round holds the messages that can travel at once: a message's round is one more than the latest "
        "round among the messages its sender received, or sent in an earlier step, before sending it."
    )
with right:
    st.subheader(f"Buffers after round {step}" if step <= last else "Buffers at the end")
    st.plotly_chart(V.buffer_figure(table), key="buffers")
    note = ""
    if scratch:
        note = (
            "Until the end, rows show each rank's partial sum of every block (kept in scratch). "
            if op == "reduce_scatter"
            else "Until the end, rows show the blocks in the order the rank holds them (scratch). "
        )
    if V.shows_numbers(table):
        text = "text: how many ranks' inputs it sums, or the rank it came from. "
    else:
        text = f"numbers appear in the cells where a row holds at most {V.NUMBERS_UP_TO} values (try 64 B). "
    st.caption(
        note + "Colour: the chunk a value belongs to; " + text + "Hover a cell for its origin. "
        "Only the first 64 values are recorded."
    )

tl = V.timeline(trace, topology=topology)
m1, m2, m3 = st.columns(3)
m1.metric("virtual time", f"{tl.duration * 1e6:.2f} µs")
m2.metric("messages", len(tl.arrows))
m3.caption("replay token (copy it to rerun this interleaving)")
m3.code(token, language=None, wrap_lines=True)
st.subheader("Timeline (virtual time; arrows are messages; the shaded band is the round shown)")
st.plotly_chart(V.timeline_figure(tl, round=step if step <= last else None), key="timeline")
if tl.contention:
    st.caption(f"{len(tl.contention)} pairs of messages shared a link at the same time (contention).")

if st.session_state.playing:
    if st.session_state.step <= last:
        time.sleep(0.5)
        st.session_state.step += 1
    else:  # played to the result: stop, and draw the play button enabled again
        st.session_state.playing = False
    st.rerun()
