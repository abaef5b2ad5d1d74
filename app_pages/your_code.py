"""Your code: paste an SPMD function ``main(rank)`` and see its trace (a separate process, opt-in only)."""

import streamlit as st

import simdist
from simdist import visualize as V

EXAMPLE = '''import torch
import simdist as dist


def main(rank):
    dist.init_process_group("gloo")
    t = torch.ones(4) * rank
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()
'''

st.title("Your code")
if not V.code_allowed():
    st.warning("Running pasted code is off. It executes whatever is pasted, so it runs only when the app is started "
               "with `SIMDIST_ALLOW_CODE=1 streamlit run app.py`, in a separate process with time and memory limits.")
    st.code(EXAMPLE, language="python")
    st.stop()
source = st.text_area("an SPMD program defining main(rank)", EXAMPLE, height=260, key="code")
world = st.slider("world size", 1, 16, 4, key="code_world")
if st.button("Run on the simulator", key="run_code"):
    with st.spinner("running in a separate process..."):
        result = V.run_code(source, world)
    if not result.ok:
        st.error("The run failed")
        st.code(result.error, language="text")
    else:
        trace = simdist.Trace.from_json(result.trace_json)
        st.table([{"rank": r, "returned": v} for r, v in enumerate(result.values)])
        st.plotly_chart(V.timeline_figure(V.timeline(trace)), key="code_timeline")
