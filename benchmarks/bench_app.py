"""(g) The visualizer: re-render time of each interaction at world 16 and 1 MiB (issue 6, item 5).

    python benchmarks/bench_app.py [--reps 5] [--quick] [--json PATH] [--profile]

Each interaction is one script run of ``app.py`` in Streamlit's AppTest (the same script
run a browser triggers, without the network and the browser's drawing): the time from
the widget change to the end of the run, including building every plotly figure.
Interactions on the Collectives page at world 16, 1 MiB, ring all_reduce: next step,
previous step, changing the topology to one seen before (traces are cached) and to one
not seen yet (a new simulation), changing the algorithm; on the other pages: switching
to a page and changing its first widget. Median over ``--reps`` repetitions, each in a
fresh AppTest (Streamlit's cache is process-wide, so the "not seen yet" case clears it
first). Target: every interaction under 1 s.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import streamlit as st
from _common import (
    base_parser,
    finish_info,
    fmt_ms,
    machine_info,
    markdown_table,
    median,
    profile_call,
    publish,
    verdict,
)
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TARGET = 1.0


def _fresh() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.sidebar.slider(key="world").set_value(16)
    at.sidebar.select_slider(key="size").set_value("1 MiB")
    at.run()
    return at


def _timed(at: AppTest, change) -> float:
    change(at)
    t0 = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - t0
    if at.exception:
        raise RuntimeError(at.exception[0].value)
    return elapsed


def _button(label):
    return lambda at: next(b for b in at.button if b.label == label).click()


def _cases() -> list[tuple[str, object, bool]]:
    """(interaction, change, clear the cache first)."""
    return [
        ("Collectives: next step", _button("next ▶"), False),
        ("Collectives: previous step", _button("◀ previous"), False),
        (
            "Collectives: topology, new (simulates)",
            lambda at: at.sidebar.selectbox(key="topology").select("ring"),
            True,
        ),
        ("Collectives: topology, seen before", lambda at: at.sidebar.selectbox(key="topology").select("switch"), False),
        (
            "Collectives: algorithm, new (simulates)",
            lambda at: at.sidebar.selectbox(key="algorithm").select("recursive_doubling"),
            True,
        ),
        ("Deadlock lab: open the page", lambda at: at.switch_page("app_pages/deadlocks.py"), False),
        ("DDP: open the page", lambda at: at.switch_page("app_pages/ddp.py"), False),
        ("Traces: open the page", lambda at: at.switch_page("app_pages/traces.py"), False),
        ("Compare algorithms: open the page (cached)", lambda at: at.switch_page("app_pages/compare.py"), False),
    ]


def measure(reps: int) -> dict:
    _fresh().switch_page("app_pages/compare.py").run()  # warm the comparison cache: computed once per setting
    raw: dict[str, list[float]] = {}
    for _ in range(reps):
        for name, change, clear in _cases():
            at = _fresh()
            if clear:
                st.cache_data.clear()
                at.run()  # the current configuration is cached again; the change is the new one
            raw.setdefault(name, []).append(_timed(at, change))
    return raw


def report(raw: dict, reps: int) -> tuple[str, list]:
    rows, verdicts = [], []
    for name, times in raw.items():
        m = median(times)
        ok = m < TARGET
        rows.append([name, fmt_ms(m, 0), fmt_ms(max(times), 0), verdict(ok)])
        verdicts.append({"case": name, "median_s": m, "met": ok})
    text = (
        f"Re-render time per interaction, world 16, 1 MiB, ring all_reduce (median of {reps}; AppTest script "
        "run, figures included, browser drawing excluded).\n\n"
        + markdown_table(["interaction", "ms (median)", "ms (max)", f"target < {TARGET * 1e3:.0f} ms"], rows)
    )
    return text, verdicts


def main(argv=None) -> dict:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    reps = args.reps or (2 if args.quick else 5)
    info = machine_info()
    raw = measure(reps)
    finish_info(info)
    text, verdicts = report(raw, reps)

    def profile(timer: str, quick: bool) -> str:
        at = _fresh()
        return profile_call(lambda: _timed(at, _button("next ▶")), timer=timer)

    return publish("app", args, info, reps, raw, text, verdicts, profile)


if __name__ == "__main__":
    main()
