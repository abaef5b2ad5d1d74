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
from ._compare import CONSTANTS as CONSTANTS
from ._compare import SYMBOLS as SYMBOLS
from ._compare import Comparison as Comparison
from ._compare import Crossover as Crossover
from ._compare import Curve as Curve
from ._compare import coincident as coincident
from ._compare import compare_algorithms as compare_algorithms
from ._compare import crossovers as crossovers
from ._compare import formula_symbols as formula_symbols
from ._compare import model_ratios as model_ratios
from ._compare import model_sides as model_sides
from ._compare import segments as segments
from ._compare import size_label as size_label
from ._compare import symbol_table as symbol_table
from ._ddp import DdpBar as DdpBar
from ._ddp import DdpBucket as DdpBucket
from ._ddp import DdpGantt as DdpGantt
from ._ddp import DdpRun as DdpRun
from ._ddp import ddp_gantt as ddp_gantt
from ._ddp import ddp_run as ddp_run
from ._figures import buffer_figure as buffer_figure
from ._figures import comparison_figure as comparison_figure
from ._figures import ddp_figure as ddp_figure
from ._figures import ddp_lanes as ddp_lanes
from ._figures import graph_figure as graph_figure
from ._figures import NUMBERS_UP_TO as NUMBERS_UP_TO
from ._figures import shows_numbers as shows_numbers
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
from ._sandbox import GradeResult as GradeResult
from ._sandbox import bubblewrap as bubblewrap
from ._sandbox import code_allowed as code_allowed
from ._sandbox import grade_code as grade_code
from ._sandbox import run_code as run_code
from ._scenarios import PROGRAM as PROGRAM
from ._scenarios import SCENARIOS as SCENARIOS
from ._scenarios import Blocked as Blocked
from ._scenarios import run_scenario as run_scenario
from ._scenarios import scenario_source as scenario_source
from ._scenarios import where_blocked as where_blocked
from ._timeline import Arrow as Arrow
from ._timeline import Contention as Contention
from ._timeline import LinkUse as LinkUse
from ._timeline import Span as Span
from ._timeline import Timeline as Timeline
from ._timeline import lanes as lanes
from ._timeline import messages_by_step as messages_by_step
from ._timeline import timeline as timeline
from ._topologies import topology_choices as topology_choices
from ._traces import CallLine as CallLine
from ._traces import LoadedTraces as LoadedTraces
from ._traces import TraceSummary as TraceSummary
from ._traces import call_lines as call_lines
from ._traces import load_traces as load_traces
from ._traces import summarize as summarize
from ._traces import trace_clock as trace_clock
from ._traces import trace_figure as trace_figure

__all__ = [
    "Arrow",
    "Blocked",
    "CallLine",
    "CONSTANTS",
    "CodeResult",
    "GradeResult",
    "NUMBERS_UP_TO",
    "SCENARIOS",
    "SYMBOLS",
    "BufferTable",
    "Cell",
    "Comparison",
    "Contention",
    "Crossover",
    "Curve",
    "DdpBar",
    "DdpBucket",
    "DdpGantt",
    "DdpRun",
    "LinkUse",
    "LoadedTraces",
    "PALETTE",
    "PROGRAM",
    "Row",
    "Rounds",
    "Span",
    "Timeline",
    "TraceSummary",
    "bubblewrap",
    "buffer_figure",
    "buffer_table",
    "call_lines",
    "chunk_colors",
    "code_allowed",
    "coincident",
    "collective_run",
    "collectives",
    "compare_algorithms",
    "comparison_figure",
    "crossovers",
    "ddp_figure",
    "ddp_gantt",
    "ddp_lanes",
    "ddp_run",
    "formula_symbols",
    "graph_figure",
    "lanes",
    "load_traces",
    "message_rounds",
    "messages_by_step",
    "model_ratios",
    "model_sides",
    "positions",
    "rank_colors",
    "round_of",
    "grade_code",
    "run_code",
    "run_scenario",
    "scenario_source",
    "segments",
    "size_label",
    "step_graph",
    "steps",
    "summarize",
    "symbol_table",
    "timeline",
    "topology_choices",
    "shows_numbers",
    "timeline_figure",
    "trace_clock",
    "trace_figure",
    "wait_for",
    "wait_for_figure",
    "where_blocked",
    "world_of",
]
