"""Your code: paste an SPMD function ``main(rank)`` and see its trace (in bubblewrap's sandbox, else opt-in only)."""

import streamlit as st

import simdist
from simdist import visualize as V

EXAMPLE = """import torch
import simdist as dist


def main(rank):
    dist.init_process_group("gloo")
    t = torch.ones(4) * rank
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()
"""

st.title("Your code")
walled = V.bubblewrap() is not None
if not (walled or V.code_allowed()):
    st.warning(
        "Running pasted code is off. It executes whatever is pasted, so it runs in bubblewrap's sandbox where "
        "bubblewrap is installed (`apt-get install bubblewrap`, then restart the app), or, on your own machine "
        "only, when the app is started with `SIMDIST_ALLOW_CODE=1 streamlit run app.py`, in a separate process "
        "with a bare environment, an empty private directory and limits on time, memory, CPU, files and processes."
    )
    st.code(EXAMPLE, language="python")
    st.stop()
if not walled:
    st.warning(
        "bubblewrap is not installed: pasted code runs in a separate process with a bare environment, an empty "
        "private directory, no network where the platform permits it and limits, but it can read what the "
        "app's user can read. This app must not be served to others."
    )
source = st.text_area("an SPMD program defining main(rank)", EXAMPLE, height=260, key="code")
world = st.slider("world size", 1, 16, 4, key="code_world")
isolation = st.radio(
    "each rank is",
    ["threads", "processes"],
    format_func=lambda kind: {"threads": "a thread (fast)", "processes": "a process of its own (as under torchrun)"}[
        kind
    ],
    horizontal=True,
    key="code_isolation",
    help="A rank as a process has its own modules, class attributes, atexit and crashes; a thread shares them "
    "with the other ranks. The same program gives the same trace both ways.",
)
if st.button("Run on the simulator", key="run_code"):
    with st.spinner("running in a separate process..."):
        result = V.run_code(source, world, isolation=isolation)
    if result.bubblewrap:
        st.caption(
            "Ran in bubblewrap's sandbox: no network, a private empty home and /tmp, read-only access to the "
            "Python installation and simdist only, its own processes (none outlives it), and limits on time, "
            "memory, CPU, files and processes."
        )
    else:
        st.caption(
            "Ran in a separate process: bare environment, empty private directory (removed afterwards), "
            "limits on time, memory, CPU, file size, open files and processes, all its processes stopped at the "
            "end. "
            + (
                "No network: it had a network namespace of its own."
                if result.network_isolated
                else "Network NOT isolated: this platform did not permit a separate network namespace."
            )
        )
    if not result.ok:
        st.error("The run failed")
        st.code(result.error, language="text")
    else:
        trace = simdist.Trace.from_json(result.trace_json)
        st.table([{"rank": r, "returned": v} for r, v in enumerate(result.values)])
        st.plotly_chart(V.timeline_figure(V.timeline(trace)), key="code_timeline")
