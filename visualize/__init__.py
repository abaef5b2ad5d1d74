"""Views of a ``simdist.Trace`` (installed as ``simdist.visualize``): pure functions, no Streamlit.

Data views return plain dataclasses and networkx graphs; the ``*_figure`` builders turn
them into plotly figures (plotly, the ``app`` extra, is imported only when one is called).
It reads traces only; it never imports a backend (``collective_run`` goes through
``simdist.simulate``)::

    res = collective_run("all_reduce", "ring", 8, 1 << 20)
    steps(res.trace)                                    # the rounds: [1, 2, ..., 14]
    g = step_graph(res.trace, 1)                        # who sends what in round 1
    table = buffer_table(res.trace, 3)                  # every rank's buffer after round 3
    tl = timeline(res.trace)                            # lanes, arrows, link contention

A step of these views is a *communication round*, numbered from 1: a message's round is
one more than the latest round among the messages its sender received, or sent in an
earlier step, before sending it (:func:`round_of`).
"""

from ._buffers import BufferTable as BufferTable
from ._buffers import Cell as Cell
from ._buffers import Row as Row
from ._buffers import buffer_table as buffer_table
from ._colors import PALETTE as PALETTE
from ._colors import chunk_colors as chunk_colors
from ._colors import rank_colors as rank_colors
from ._compare import Comparison as Comparison
from ._compare import Crossover as Crossover
from ._compare import Curve as Curve
from ._compare import compare_algorithms as compare_algorithms
from ._compare import crossovers as crossovers
from ._figures import buffer_figure as buffer_figure
from ._figures import comparison_figure as comparison_figure
from ._figures import graph_figure as graph_figure
from ._figures import timeline_figure as timeline_figure
from ._figures import wait_for_figure as wait_for_figure
from ._graph import collectives as collectives
from ._graph import positions as positions
from ._graph import step_graph as step_graph
from ._graph import steps as steps
from ._graph import wait_for as wait_for
from ._graph import world_of as world_of
from ._rounds import Rounds as Rounds
from ._rounds import message_rounds as message_rounds
from ._rounds import round_of as round_of
from ._runs import collective_run as collective_run
from ._sandbox import CodeResult as CodeResult
from ._sandbox import code_allowed as code_allowed
from ._sandbox import run_code as run_code
from ._scenarios import SCENARIOS as SCENARIOS
from ._scenarios import run_scenario as run_scenario
from ._scenarios import scenario_source as scenario_source
from ._timeline import Arrow as Arrow
from ._timeline import Contention as Contention
from ._timeline import LinkUse as LinkUse
from ._timeline import Span as Span
from ._timeline import Timeline as Timeline
from ._timeline import lanes as lanes
from ._timeline import messages_by_step as messages_by_step
from ._timeline import timeline as timeline

__all__ = [
    "Arrow",
    "CodeResult",
    "SCENARIOS",
    "BufferTable",
    "Cell",
    "Comparison",
    "Contention",
    "Crossover",
    "Curve",
    "LinkUse",
    "PALETTE",
    "Row",
    "Rounds",
    "Span",
    "Timeline",
    "buffer_figure",
    "buffer_table",
    "chunk_colors",
    "code_allowed",
    "collective_run",
    "collectives",
    "compare_algorithms",
    "comparison_figure",
    "crossovers",
    "graph_figure",
    "lanes",
    "message_rounds",
    "messages_by_step",
    "positions",
    "rank_colors",
    "round_of",
    "run_code",
    "run_scenario",
    "scenario_source",
    "step_graph",
    "steps",
    "timeline",
    "timeline_figure",
    "wait_for",
    "wait_for_figure",
    "world_of",
]
