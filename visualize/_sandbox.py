"""Running pasted code: in a separate process, with time and memory limits, never in the caller's.

``run_code(source, world)`` executes ``source`` in a fresh ``python3`` process that
defines ``main(rank)``, runs it on ``world`` simulated ranks, and sends back the trace as
JSON. Pasted code can do anything the user running the app can do; the app offers this
only when started with ``SIMDIST_ALLOW_CODE=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["CodeResult", "run_code", "code_allowed", "ALLOW_ENV"]

ALLOW_ENV = "SIMDIST_ALLOW_CODE"

_WORKER = r"""
import json, resource, sys
limit = int(sys.argv[2]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import simdist
source = open(sys.argv[1]).read()
namespace = {"__name__": "pasted"}
exec(compile(source, "<pasted code>", "exec"), namespace)
main = namespace.get("main")
if not callable(main):
    raise SystemExit("the pasted code must define main(rank)")
world = int(sys.argv[3])
try:
    res = simdist.simulate(main, world, seed=0, leaks="ignore")
    out = {"ok": True, "trace": res.trace.to_json(), "values": [repr(v)[:200] for v in res.values]}
except simdist.DistError as err:
    out = {"ok": False, "error": f"{type(err).__name__}: {err}"}
print("\n@@SIMDIST@@" + json.dumps(out))
"""


@dataclass(frozen=True)
class CodeResult:
    """What a run of pasted code gave: a trace (JSON) and values, or an error text."""

    ok: bool
    trace_json: str | None = None
    values: tuple = ()
    error: str | None = None


def code_allowed() -> bool:
    """Whether this process was started with ``SIMDIST_ALLOW_CODE=1``."""
    return os.environ.get(ALLOW_ENV) == "1"


def run_code(source: str, world: int, *, timeout: float = 20.0, memory_mb: int = 2048) -> CodeResult:
    """Run ``main(rank)`` from ``source`` on ``world`` simulated ranks in a child process; its trace or its error."""
    import tempfile

    if not isinstance(source, str):
        raise TypeError(f"source must be a str, got {type(source).__name__}")
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= 64:
        raise ValueError(f"world={world!r} must be an int from 1 to 64")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
        path = f.name
    try:
        proc = subprocess.run([sys.executable, "-c", _WORKER, path, str(memory_mb), str(world)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return CodeResult(False, error=f"the code did not finish within {timeout:g} s (it was stopped)")
    finally:
        os.unlink(path)
    head, sep, tail = proc.stdout.rpartition("@@SIMDIST@@")
    if not sep:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return CodeResult(False, error="\n".join(lines[-15:]) or f"the child process exited with {proc.returncode}")
    out = json.loads(tail)
    if not out["ok"]:
        return CodeResult(False, error=out["error"])
    return CodeResult(True, trace_json=out["trace"], values=tuple(out["values"]))
