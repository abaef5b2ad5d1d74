"""Traces: download the current run as Chrome/Perfetto JSON; upload simdist traces and see their timeline."""

import streamlit as st

from simdist import visualize as V

st.title("Traces")
st.subheader("Download a run")
op = st.selectbox("collective", ["all_reduce", "broadcast", "all_gather", "reduce_scatter"], key="tr_op")
world = st.slider("world size", 2, 16, 4, key="tr_world")
res = V.collective_run(op, "ring" if op != "broadcast" else "binomial", world, 4096)
st.download_button(
    "Download trace (Chrome/Perfetto JSON)",
    res.trace.to_chrome_json(),
    file_name=f"simdist_{op}_{world}.json",
    mime="application/json",
)
st.download_button(
    "Download trace (simdist JSON, for upload here)",
    res.trace.to_json(),
    file_name=f"simdist_{op}_{world}.trace.json",
    mime="application/json",
)
st.caption("Open the Chrome/Perfetto JSON at ui.perfetto.dev or chrome://tracing.")

st.subheader("Look at a trace")
st.markdown(
    "A run of your own script on simulated ranks writes one: "
    "`simdist run --backend sim --nproc-per-node 4 --trace run.json train.py` (add `--replay TOKEN` for the run "
    "a failure or `simdist test` printed). A real run's ranks write one file each with `SIMDIST_TRACE=DIR`."
)
uploaded = st.file_uploader(
    "simdist traces (simdist JSON): one file, or one per rank of a real run",
    type=["json"],
    accept_multiple_files=True,
    key="tr_upload",
)
if not uploaded:
    trace = res.trace
    st.caption("No trace uploaded: showing the run above.")
else:
    loaded = V.load_traces([(f.name, f.getvalue()) for f in uploaded])
    for name, why in loaded.problems:
        kept = f"; showing the other {len(loaded.names)} file(s)" if loaded.trace is not None else ""
        (st.warning if loaded.trace is not None else st.error)(f"**{name}** was left out: {why}{kept}.")
    if loaded.trace is None:
        st.stop()
    trace = loaded.trace
summary = V.summarize(trace)
cols = st.columns(5)
cols[0].metric("clock", summary.clock, help="virtual: the simulator's clock; real: wall-clock time of a real run")
cols[1].metric("ranks", summary.ranks)
cols[2].metric("collectives", summary.collectives)
cols[3].metric("messages", summary.messages)
cols[4].metric("events", len(trace))
st.caption(summary.note)
st.plotly_chart(V.trace_figure(trace), key="uploaded_timeline")
lines = V.call_lines(trace)
if lines:
    unit = "µs" if summary.clock == "virtual" else "ms"  # (the clock: the metric above)
    scale = 1e6 if summary.clock == "virtual" else 1e3
    st.subheader("The program's lines that communicate")
    st.dataframe(
        [
            {
                "line": c.site,
                "calls": ", ".join(c.ops),
                "ranks": ", ".join(map(str, c.ranks)),
                "times called": c.calls,
                f"time in the calls, {unit}": round(c.seconds * scale, 3),
            }
            for c in lines
        ],
        hide_index=True,
    )
    st.caption(f"Each send, receive and collective at the line that called it ({lines[0].call_site}, ...).")
