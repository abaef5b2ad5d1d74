"""Compare algorithms: virtual time against message size, the alpha-beta formula of each, crossovers."""

import streamlit as st

from simdist import visualize as V
from simdist.algorithms import ALGORITHMS

SIZES = [1 << k for k in range(4, 23, 3)]  # 16 B to 4 MiB
ON_LINE = 0.01  # a point within 1% of its line is on it


@st.cache_data(show_spinner="simulating every algorithm at every size...", max_entries=32)
def compare(op: str, world: int, topology: str):
    return V.compare_algorithms(op, world, SIZES, topology=topology)


def listing(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def span(ratios: tuple[float, float]) -> str:
    return f"{ratios[0]:.2f} – {ratios[1]:.2f}"


st.title("Compare algorithms")
with st.sidebar:
    op = st.selectbox("collective", sorted(ALGORITHMS), index=sorted(ALGORITHMS).index("all_reduce"), key="cmp_op")
    world = st.slider("world size", 2, 16, 8, key="cmp_world")
    names = V.topology_choices()
    topology = st.selectbox("topology", names, key="cmp_topology")

cmp = compare(op, world, topology)
uniform = (cmp.slowest_alpha, cmp.slowest_beta) == (cmp.alpha, cmp.beta)
slowest = False
if not uniform:
    far = cmp.slowest[1]
    slowest = st.sidebar.radio("model lines use α, β of", [False, True], key="cmp_slowest",
                               format_func=lambda s: f"ranks 0 and {far} (the slowest pair)" if s
                               else "ranks 0 and 1")  # fmt: skip

st.plotly_chart(V.comparison_figure(cmp, slowest=slowest), key="comparison")
notes = [
    (
        "Markers and thick solid lines: simulated. Thin dashed lines: the α-β formula of the same colour "
        "(symbols defined below)."
    )
]
for group in V.coincident(cmp):
    names = f"{', '.join(group[:-1])} and {group[-1]}"
    notes.append(
        f"{names} take exactly the same time at every size here, so their curves are drawn "
        "side by side, each shifted slightly right of the one before (hover for the true size)."
    )
    if "hierarchical" in group and not cmp.per_machine:
        notes.append(
            "hierarchical reduces within each machine first, then across the machines; this topology "
            "has no machines of equal size, so it runs the pipelined ring."
        )
    if "ring_pipelined" in group and set(V.segments(cmp)) == {1}:
        notes.append(
            "ring_pipelined splits each block into S segments, and S = 1 at every size shown (see S "
            "below): it sends what the ring sends."
        )
if cmp.crossovers:
    notes.append("Dotted vertical lines: where the fastest simulated algorithm changes (table below).")
st.caption(" ".join(notes))

st.subheader("Where the points leave the lines")
pair = V.model_ratios(cmp)
far_ratios = V.model_ratios(cmp, slowest=True)
rows = []
for c in cmp.curves:
    row = {"algorithm": c.algorithm, "simulated ÷ model, α β of ranks 0 and 1": span(pair[c.algorithm])}
    if not uniform:
        row[f"simulated ÷ model, α β of ranks 0 and {cmp.slowest[1]}"] = span(far_ratios[c.algorithm])
    rows.append(row)
st.table(rows)
off = [c.algorithm for c in cmp.curves if max(abs(x - 1) for x in pair[c.algorithm]) > ON_LINE]
if uniform:
    st.write(
        f"Every pair of ranks here has the same path (α = {cmp.alpha * 1e6:g} µs, "
        f"β = {cmp.beta * 1e9:g} ns/B), as the formulas assume. "
        + (
            "Every point is within 1% of its line."
            if not off
            else f"Off their line by more than 1% somewhere: {listing(off)} (the table gives how far)."
        )
    )
elif topology == "two_level":
    lo = min(r[0] for r in pair.values())
    hi = max(r[1] for r in pair.values())
    above, below, on = V.model_sides(cmp, slowest=True, within=ON_LINE)
    sides = [(on, "on its line at some size, never above it"),
             (below, ("below its line: some of their messages stay inside a node, where they cost less than priced, "
                      "and that shortens their critical path")),
             (above, ("above its line at some size: ranks of one node send across at the same time and queue on "
                      "the node's one uplink, which the formula does not count"))]  # fmt: skip
    st.markdown(
        f"**Why the lines {'sit below' if lo > 1 else 'differ from'} the points on two_level.** The formulas price "
        f"every message alike, with the α and β of ranks 0 and 1. Those two share a node: α = {cmp.alpha * 1e6:g} µs "
        f"(two 0.5 µs links through the node's switch), β = {cmp.beta * 1e9:g} ns/B ({1 / cmp.beta / 1e9:g} GB/s). "
        f"Ranks on different nodes talk through their nodes' uplinks and the spine: α = {cmp.slowest_alpha * 1e6:g} "
        f"µs (four links), β = {cmp.slowest_beta * 1e9:g} ns/B ({1 / cmp.slowest_beta / 1e9:g} GB/s, "
        f"{cmp.slowest_beta / cmp.beta:g}× the time per byte), and the 4 ranks of a node share its one uplink. "
        f"Every algorithm here sends some messages between nodes: its points are {lo:.2f}× to {hi:.2f}× its line."
        f"\n\nPriced as if every message crossed between nodes (sidebar: ranks 0 and {cmp.slowest[1]}), the lines "
        "move up. Then:\n" + "".join(f"- {listing(names)}: {why};\n" for names, why in sides if names)
    )
else:
    hops = (
        (
            " Each of them sends messages between ranks that are not neighbours on the ring: those cross several "
            "links and can queue behind other messages on them."
        )
        if topology == "ring" and off
        else ""
    )
    st.markdown(
        f"**Why the lines and the points differ on {topology}.** The formulas price every message alike, with the "
        f"α and β of ranks 0 and 1 (α = {cmp.alpha * 1e6:g} µs, β = {cmp.beta * 1e9:g} ns/B), as if every pair of "
        f"ranks had a path like theirs. Here pairs differ: ranks 0 and {cmp.slowest[1]} are "
        f"α = {cmp.slowest_alpha * 1e6:g} µs, β = {cmp.slowest_beta * 1e9:g} ns/B apart. Off their line by more than "
        f"1% somewhere: {listing(off)}.{hops}"
    )

st.subheader("Formulas")
st.table([{"algorithm": c.algorithm, "α-β cost": c.formula} for c in cmp.curves])
st.subheader("Symbols")
st.table(V.symbol_table(cmp, slowest=slowest))
st.subheader("Crossovers")
if cmp.crossovers:
    st.table(
        [
            {
                "between": f"{V.size_label(x.below)} and {V.size_label(x.above)}",
                "fastest before": x.before,
                "fastest after": x.after,
            }
            for x in cmp.crossovers
        ]
    )
else:
    st.write("One algorithm is fastest at every size.")

st.subheader("How far to trust simulated times")
st.markdown(
    "Checked against real processes of the socket backend (BENCHMARKS.md, sections (m) and (o)). **Where the "
    "network decides** (hosts joined by links of 100 Mbit/s to 1 Gbit/s, messages of 256 KiB and more), a topology "
    "file that `simdist calibrate --nnodes N` wrote on those hosts predicts every op and algorithm with a median "
    "error of 2-3.5% while the CPUs keep up (a collective's messages timed as TCP flows that share the links); in"
    " one run every case was within 25%, in another 2% missed by more (up to 43%), where a noisy measurement or the"
    " fixed costs of a call decided. **Where the"
    " CPU decides** (ranks of one machine"
    " over loopback or shared memory: copies, page faults, Python, the scheduler), a calibrated file is off by "
    "about 15% in the median and up to 2x in single cases, and the named topologies here are not measured at all: "
    "read these curves for which algorithm wins and why, not for milliseconds."
)
