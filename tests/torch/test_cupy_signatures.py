"""The NCCL stand-in (tests/support/nccl_emulation.py) against the real cupy: the unique id's form.

cupy 14 and newer take NCCL's unique id as ``bytes``, cupy 13 and older as a tuple of 128
signed chars; each raises ``TypeError`` on the other form before touching a device, so the
check runs on a machine without a GPU. Where the real cupy is installed (CI installs cupy 14
beside one torch release and cupy 13 beside the other), the form simdist passes
(``decode_unique_id``) must pass the real ``NcclCommunicator``'s argument check, the other
form must fail it, and the stand-in mirroring that cupy release must accept and refuse the
same; and every name the stand-in defines (constants, functions, the communicator's methods) exists in
the real module, each method with the real one's number of arguments. Without cupy, the stand-in is
checked against the forms above for both releases.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simdist.backends.nccl._world import decode_unique_id, encode_unique_id

pytestmark = [pytest.mark.cupy, pytest.mark.timeout(600)]

EMULATION = Path(__file__).resolve().parents[1] / "support" / "nccl_emulation.py"
UID = bytes(range(128))


def _other_form(uid: bytes | tuple) -> bytes | tuple:
    return tuple(b - 256 if b > 127 else b for b in uid) if isinstance(uid, bytes) else encode_unique_id(uid)


SUBPROCESS_S = 240
"""A fresh interpreter that imports torch: under CI's load (the release jobs beside the main suite) one took over
60 s to start."""


def _stand_in_refuses(cupy_major: int, uid: bytes | tuple) -> bool:
    """Whether the stand-in mirroring ``cupy_major`` raises TypeError on ``uid`` (in a process of its own)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import nccl_emulation as e\n"
        f"try:\n    e.Communicator(1, {uid!r}, 0)\nexcept TypeError as exc:\n    print('TypeError', exc)\n"
        "except Exception:\n    print('accepted')\nelse:\n    print('accepted')\n"
    )
    env = {**os.environ, "SIMDIST_EMULATED_CUPY": str(cupy_major)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(EMULATION.parent)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_S,
        env=env,
    )
    assert out.returncode == 0 and out.stdout, out.stdout + out.stderr
    return out.stdout.startswith("TypeError")


@pytest.mark.parametrize("cupy_major", [13, 14])
def test_the_id_round_trips_through_the_store_in_each_releases_form(cupy_major: int) -> None:
    uid = decode_unique_id(UID, cupy_major)
    assert isinstance(uid, bytes if cupy_major >= 14 else tuple)
    assert encode_unique_id(uid) == UID
    assert not _stand_in_refuses(cupy_major, uid)
    assert _stand_in_refuses(cupy_major, _other_form(uid))


def test_the_real_cupy_takes_the_form_simdist_passes_and_the_stand_in_agrees() -> None:
    nccl = pytest.importorskip("cupy.cuda.nccl", reason="the real cupy is not installed (CI installs it)")
    import cupy

    major = int(cupy.__version__.split(".")[0])
    made = nccl.get_unique_id()
    assert isinstance(made, bytes if major >= 14 else tuple) and len(made) == 128, made
    uid = decode_unique_id(encode_unique_id(made))
    assert uid == made

    def refuses(candidate: bytes | tuple) -> bool:
        try:
            nccl.NcclCommunicator(1, candidate, 0)
        except TypeError:
            return True
        except Exception:  # noqa: BLE001 - past the argument check: NCCL or CUDA errors without a GPU
            return False
        return False

    assert not refuses(uid), f"cupy {cupy.__version__} refuses the unique id simdist passes ({type(uid).__name__})"
    assert refuses(_other_form(uid)), f"cupy {cupy.__version__} also takes {type(_other_form(uid)).__name__}"
    assert not _stand_in_refuses(major, uid) and _stand_in_refuses(major, _other_form(uid))


STAND_IN_NAMES = """
import inspect, json, sys
sys.path.insert(0, sys.argv[1])
import nccl_emulation as e
names = [name for name, _ in [*e._TYPES.values(), *e._OPS.values()]]
methods = {n: len(inspect.signature(f).parameters) for n, f in vars(e.Communicator).items()
           if inspect.isfunction(f) and not n.startswith("_")}
print(json.dumps({"names": names + ["get_unique_id", "groupStart", "groupEnd", "NcclCommunicator"], "methods": methods}))
"""


def _real_arity(method: object) -> int:
    """Arguments of a cupy Cython method, self included, from the signature its docstring's first line embeds."""
    first = (getattr(method, "__doc__", None) or "").strip().splitlines()[0]
    found = re.fullmatch(r"[\w.]+\((.*)\)", first)
    assert found, f"no embedded signature in {first!r}"
    return len([a for a in found.group(1).split(",") if a.strip()])


def test_the_stand_in_has_only_names_and_arities_the_real_cupy_has() -> None:
    nccl = pytest.importorskip("cupy.cuda.nccl", reason="the real cupy is not installed (CI installs it)")
    out = subprocess.run(
        [sys.executable, "-c", STAND_IN_NAMES, str(EMULATION.parent)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_S,
    )
    assert out.returncode == 0, out.stderr
    stand_in = json.loads(out.stdout)
    assert [n for n in stand_in["names"] if not hasattr(nccl, n)] == []
    for name, arity in stand_in["methods"].items():
        real = getattr(nccl.NcclCommunicator, name, None)
        assert real is not None, f"cupy's NcclCommunicator has no {name}"
        assert _real_arity(real) == arity, (name, inspect.getdoc(real))
