"""Deadlock lab: run a deadlocking program, see where each rank is blocked, its wait-for graph and the report."""

import streamlit as st

from simdist import visualize as V

GRAPH_WIDTH = 720  # px: fits beside the sidebar at 1280 wide
PROGRAM_WIDTH = 640  # px: 75 characters of code; beside the graph at 1920 wide, above it at 1280


@st.cache_data(show_spinner=False)
def report(name: str):
    err = V.run_scenario(name)
    return err, str(err)


def highlight(blocked) -> str:
    """CSS that marks each blocked line of the program block (line N is the block's N-th line element)."""
    ranks: dict[int, list[int]] = {}
    for b in blocked:
        if b.line is not None:
            ranks.setdefault(b.line, []).append(b.rank)
    rules = []
    for line, rs in sorted(ranks.items()):
        who = f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"
        sel = f".st-key-program code > span:nth-child({line})"
        rules.append(f"{sel} {{ background: #FFD9D9; font-weight: 600; }}")
        rules.append(
            f'{sel}::after {{ content: "◀ {who}"; color: #B3001B; font-weight: 700; margin-left: auto; padding-left: 1em; '
            "white-space: nowrap; }"
        )
    return "<style>" + "\n".join(rules) + "</style>"


st.title("Deadlock lab")
name = st.selectbox("scenario", list(V.SCENARIOS), key="scenario")
scenario = V.SCENARIOS[name]
st.info(scenario.why)
err, text = report(name)
graph = V.wait_for(err)
source = V.scenario_source(name)
blocked = V.where_blocked(graph, source)
st.html(highlight(blocked))
with st.container(horizontal=True, wrap=True, gap="large"):
    with st.container(width=PROGRAM_WIDTH, key="program"):
        st.subheader(f"{V.PROGRAM} on {scenario.world} ranks")
        st.code(source, language="python", line_numbers=True, wrap_lines=True)
    with st.container(width=GRAPH_WIDTH):
        st.subheader("Wait-for graph")
        st.plotly_chart(
            V.wait_for_figure(graph, GRAPH_WIDTH), width="content", key="wait_for", config={"displayModeBar": False}
        )
        st.caption("An arrow goes from a blocked rank to the rank it waits for; a cycle means no rank can proceed.")
st.subheader("Where each rank is blocked")
rows = ["| rank | line | blocked in | waits for |", "|---|---|---|---|"]
for b in blocked:
    line = "—" if b.line is None else f"**{b.line}**"
    rows.append(f"| **{b.rank}** | {line} | {b.call} | {b.waits or '—'} |")
st.markdown("\n".join(rows))
st.subheader("The report (simdist.DeadlockError)")
st.code(text, language="text", wrap_lines=True)
st.subheader("Your own script")
st.markdown(
    "`simdist test --nproc-per-node 4 train.py` runs a torchrun script under many schedules and reports the first "
    "deadlock (or other failure) as above, with the command that replays it: "
    "`simdist run --backend sim --nproc-per-node 4 --replay TOKEN train.py`. Add `--trace run.json` to that command "
    "and open the file on the **Traces** page to see the run, at your script's lines."
)
