"""The public functions' docstrings: each has its sections, and each example runs and prints what it shows.

An example is a doctest inside the docstring's ``Example:`` section; it runs on the simulator,
so its per-rank output is deterministic and is compared with the docstring exactly (whitespace
normalized). The sections follow STYLE.md rule 9: the result first, then ``Args:`` (when the
function takes arguments), ``Returns:`` (when it returns something), and ``Example:``.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import warnings

import pytest

pytestmark = pytest.mark.timeout(120)

# (module, names): every public function documented to rule 9, in the order they are documented.
SURFACES = [
    ("simdist.api._setup", None),  # None: every function of the module's __all__
    ("simdist.api._p2p", None),
    ("simdist.api._collectives", None),
    ("simdist.backends.sim._runner", ["simulate"]),
    ("simdist.launch._launch", ["spawn"]),
    ("simdist.testing", None),
    ("simdist.visualize", None),
]


def _public_functions() -> list[tuple[str, object]]:
    """``(qualified name, function)`` of every function the surfaces name."""
    found = []
    for modname, names in SURFACES:
        module = importlib.import_module(modname)
        for name in names if names is not None else module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                found.append((f"{modname}.{name}", obj))
    return found


FUNCTIONS = _public_functions()
IDS = [name for name, _ in FUNCTIONS]


def _returns_something(fn: object) -> bool:
    """Whether ``fn``'s return annotation says it returns a value (anything but ``None``)."""
    ret = inspect.signature(fn).return_annotation
    return ret not in (None, "None", inspect.Signature.empty)


def _sections(doc: str) -> set[str]:
    """The Google-style section headers of ``doc`` (``Args:``, ``Returns:``, ...), as written."""
    return {line.strip() for line in doc.splitlines() if line.strip() in {"Args:", "Returns:", "Raises:", "Example:"}}


def test_the_surface_is_what_the_brief_counts():
    """The torch.distributed functions (set-up, point-to-point, collectives) are 29 (``P2POp`` is a class); all are checked here."""
    api = [
        name
        for name in IDS
        if name.startswith(("simdist.api._setup.", "simdist.api._p2p.", "simdist.api._collectives."))
    ]
    assert len(api) == 29, api
    assert "simdist.backends.sim._runner.simulate" in IDS and "simdist.launch._launch.spawn" in IDS


@pytest.mark.parametrize("name, fn", FUNCTIONS, ids=IDS)
def test_docstring_has_its_sections(name, fn):
    doc = inspect.getdoc(fn) or ""
    summary = doc.splitlines()[0] if doc else ""
    assert summary and not summary.startswith(("Args", "Example")), f"{name}: no one-line result first"
    sections = _sections(doc)
    if [p for p in inspect.signature(fn).parameters if p not in ("self",)]:
        assert "Args:" in sections, f"{name} takes arguments but has no Args: section"
    if _returns_something(fn):
        assert "Returns:" in sections, f"{name} returns a value but has no Returns: section"
    assert "Example:" in sections, f"{name} has no Example: section"
    example = doc.split("Example:", 1)[1]
    assert ">>> " in example, f"{name}: its Example: section has no doctest"


@pytest.mark.parametrize("name, fn", FUNCTIONS, ids=IDS)
def test_docstring_examples_run(name, fn):
    parser = doctest.DocTestParser()
    test = parser.get_doctest(inspect.getdoc(fn) or "", {}, name, None, 0)
    assert test.examples, f"{name} has no example to run"
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    runner = doctest.DocTestRunner(optionflags=flags, verbose=False)
    report: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an example must not leak (LeakWarning) or warn at all
        result = runner.run(test, out=report.append)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} example lines failed\n" + "".join(report)
