"""Compare algorithms: virtual time against message size, the alpha-beta formula of each, crossovers."""

import streamlit as st

import simdist
from simdist import visualize as V
from simdist.algorithms import ALGORITHMS

SIZES = [1 << k for k in range(4, 23, 3)]  # 16 B to 4 MiB


@st.cache_data(show_spinner="simulating every algorithm at every size...", max_entries=32)
def compare(op: str, world: int, topology: str):
    return V.compare_algorithms(op, world, SIZES, topology=topology)


st.title("Compare algorithms")
with st.sidebar:
    op = st.selectbox("collective", sorted(ALGORITHMS), index=sorted(ALGORITHMS).index("all_reduce"), key="cmp_op")
    world = st.slider("world size", 2, 16, 8, key="cmp_world")
    names = sorted(simdist.TOPOLOGIES, key=lambda n: (n != "switch", n))
    topology = st.selectbox("topology", names, key="cmp_topology")

cmp = compare(op, world, topology)
st.plotly_chart(V.comparison_figure(cmp), key="comparison")
st.caption(f"Simulated (markers) and alpha-beta model (lines): alpha = {cmp.alpha * 1e6:.2f} µs per message, "
           f"beta = {cmp.beta * 1e9:.3f} ns per byte.")
st.subheader("Formulas")
st.table([{"algorithm": c.algorithm, "alpha-beta cost": c.formula} for c in cmp.curves])
st.subheader("Crossovers")
if cmp.crossovers:
    st.table([{"between": f"{x.below} B and {x.above} B", "fastest before": x.before, "fastest after": x.after}
              for x in cmp.crossovers])
else:
    st.write("One algorithm is fastest at every size.")
