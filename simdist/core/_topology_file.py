"""Topology files: a network's parameters in JSON, read by ``simulate(topology="file.json")``.

A topology file is one JSON object; ``simdist calibrate`` writes one for the machine it
runs on, and simdist ships reference files for common clusters (:data:`REFERENCES`)::

    {
      "format": 1,                     required: this version of the format
      "name": "loopback",              required: a short name for reports
      "layout": "switch",              required: switch | fully_connected | ring | two_level
      "alpha": 4.1e-05,                required: seconds of latency per link
      "bandwidth": 2.3e9,              required: bytes per second per link
      "burst": 0,                      bytes a link passes at once after being idle: a token
                                       bucket, as on a shaped link (default 0: none)
      "gamma": 2.5e-10,                seconds per byte reduced (default 0)
      "fresh_memory": 3.1e-10,         seconds per byte of a new buffer of fresh_from bytes
                                       or more: its page faults (default 0)
      "fresh_from": 33554432,          bytes: the smallest new buffer charged fresh_memory
                                       (default 131072)
      "memcpy": 5.2e-11,               seconds per byte a rank copies between its own buffers:
                                       staging a collective's lists, the algorithms' own
                                       copies (default 0)
      "check_overhead": 1.1e-04,       seconds per round of the socket backend's cross-rank
                                       check before each collective (default 0)
      "call_overhead": 7e-05,          seconds a rank spends on each collective outside its
                                       messages and the check (default 0)
      "rank_bandwidth": 3.4e9,         bytes per second one rank sends and receives together
                                       (default null: unlimited)
      "host_bandwidth": 6.1e9,         bytes per second one host moves for all its ranks
                                       (default null: unlimited)
      "host_overhead": 8e-05,          seconds of a host's time per message (default 0)
      "host_cores": 2,                 reductions one host runs at once (default null: all)
      "ranks_per_host": null,          ranks per host (default null: every rank on one host)
      "per_node": 8,                   two_level only: ranks per node; "alpha" and
      "inter_alpha": 1e-06,            "bandwidth" are then the links inside a node,
      "inter_bandwidth": 2.5e10,       "inter_*" the node's uplink to the spine, which
      "inter_burst": 0,                the node's ranks share (its "burst": inter_burst)
      "link_queues": false,            each link of a route takes a message once it is free, as
                                       a switch queues it (default false: a message holds its
                                       whole route at once)
      "flows": false,                  a collective's messages are TCP flows: each leaves when
                                       posted, messages crossing a link at once share it fairly,
                                       a pair's messages follow each other (default false)
      "send_buffer": 0,                with flows: bytes of a send its sender's kernel keeps;
                                       the send is done once no more is left (default 0)
      "comment": "...",                free text: where the figures come from
      "sources": ["..."],              free text: references for the figures
      "measured": {...}                free: what calibration measured, kept as written
    }

``alpha`` and ``bandwidth`` are per link: on ``switch`` a message crosses two links (its
latency is ``2 * alpha``), on ``fully_connected`` and ``ring`` neighbours one. The terms
are those of :mod:`simdist.core._topology`. ``simdist calibrate --nnodes N`` run on N hosts writes a
``two_level`` file: a node per host, ``inter_*`` its link to the others.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ._topology import FRESH_BYTES, Topology, fully_connected, ring, switch, two_level

__all__ = [
    "FORMAT",
    "LAYOUTS",
    "REFERENCES",
    "check_spec",
    "load_topology",
    "read_topology_file",
    "reference_path",
    "topology_from_spec",
    "write_topology_file",
]

FORMAT = 1
"""The version of the file format that this module reads and writes."""

LAYOUTS = ("switch", "fully_connected", "ring", "two_level")
"""The values of a file's ``layout``."""

REFERENCES = ("dgx-a100-nvlink", "ib-hdr-4node")
"""The shipped reference topologies (``simdist/topologies/NAME.json``), usable by name."""

_REQUIRED = {"format": int, "name": str, "layout": str, "alpha": float, "bandwidth": float}
_OPTIONAL = {
    "gamma": float,
    "fresh_memory": float,
    "fresh_from": int,
    "memcpy": float,
    "check_overhead": float,
    "call_overhead": float,
    "rank_bandwidth": float,
    "host_bandwidth": float,
    "host_overhead": float,
    "host_cores": int,
    "ranks_per_host": int,
    "burst": float,
    "per_node": int,
    "inter_alpha": float,
    "inter_bandwidth": float,
    "inter_burst": float,
    "link_queues": bool,
    "flows": bool,
    "send_buffer": int,
    "comment": str,
    "sources": list,
    "measured": dict,
}
_SECONDS = ("gamma", "fresh_memory", "memcpy", "check_overhead", "call_overhead", "host_overhead")
"""Fields of seconds (per byte, message or round) that may be 0."""
_BYTES = ("burst", "inter_burst", "send_buffer")
"""Fields of bytes that may be 0."""
_TWO_LEVEL = ("per_node", "inter_alpha", "inter_bandwidth")


def reference_path(name: str) -> Path:
    """The shipped file of reference topology ``name`` (one of :data:`REFERENCES`)."""
    return Path(__file__).resolve().parent.parent / "topologies" / f"{name}.json"


def _check_field(key: str, value: Any, kind: type, where: str) -> None:
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        raise ValueError(f"{where}: {key}={value!r} is not a valid {kind.__name__}")
    free = ("format", *_SECONDS, *_BYTES, "comment", "sources", "measured", "name", "layout", "link_queues", "flows")
    positive = key not in free
    if positive and value <= 0:
        raise ValueError(f"{where}: {key}={value!r}; expected a positive number")
    if key in _SECONDS and value < 0:
        raise ValueError(f"{where}: {key}={value!r}; expected a number of seconds >= 0")
    if key in _BYTES and value < 0:
        raise ValueError(f"{where}: {key}={value!r}; expected a number of bytes >= 0")


def check_spec(spec: Any, where: str = "topology file") -> dict[str, Any]:
    """``spec`` itself once it is a valid topology file's object; raises ``ValueError`` naming what is wrong."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(spec).__name__}")
    for key, kind in _REQUIRED.items():
        if key not in spec:
            raise ValueError(f"{where}: the field {key!r} is missing; required fields: {', '.join(_REQUIRED)}")
        _check_field(key, spec[key], kind, where)
    if spec["format"] != FORMAT:
        raise ValueError(f"{where}: format={spec['format']!r}; this simdist reads format {FORMAT}")
    if spec["layout"] not in LAYOUTS:
        raise ValueError(f"{where}: layout={spec['layout']!r}; expected one of {', '.join(LAYOUTS)}")
    for key, value in spec.items():
        if key in _REQUIRED:
            continue
        if key not in _OPTIONAL:
            raise ValueError(f"{where}: unknown field {key!r}; expected {', '.join([*_REQUIRED, *_OPTIONAL])}")
        if value is not None:
            _check_field(key, value, _OPTIONAL[key], where)
    if spec["layout"] == "two_level":
        missing = [k for k in _TWO_LEVEL if spec.get(k) is None]
        if missing:
            raise ValueError(f"{where}: layout 'two_level' needs {', '.join(missing)}")
    return spec


def read_topology_file(path: str | Path) -> dict[str, Any]:
    """The checked object of the topology file at ``path`` (see the module doc for its fields)."""
    where = f"topology file {str(path)!r}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{where} cannot be read: {exc.strerror or exc}") from exc
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON: {exc}") from exc
    return check_spec(spec, where)


def write_topology_file(path: str | Path, spec: dict[str, Any]) -> Path:
    """Write ``spec`` (checked first) to ``path`` as indented JSON; returns the path."""
    check_spec(spec, f"topology for {str(path)!r}")
    path = Path(path)
    path.write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    return path


def topology_from_spec(spec: dict[str, Any], size: int) -> Topology:
    """The :class:`Topology` of ``size`` ranks that a checked file object describes."""
    layout, alpha, bandwidth = spec["layout"], float(spec["alpha"]), float(spec["bandwidth"])
    burst = float(spec.get("burst") or 0.0)
    if layout == "two_level":
        topo = two_level(
            size,
            per_node=spec["per_node"],
            intra_alpha=alpha,
            intra_bandwidth=bandwidth,
            inter_alpha=float(spec["inter_alpha"]),
            inter_bandwidth=float(spec["inter_bandwidth"]),
            intra_burst=burst,
            inter_burst=float(spec.get("inter_burst") or 0.0),
        )
    else:
        make = {"switch": switch, "fully_connected": fully_connected, "ring": ring}[layout]
        topo = make(size, alpha, bandwidth, burst)
    topo.name = spec["name"]
    topo.gamma = float(spec.get("gamma") or 0.0)
    topo.host_overhead = float(spec.get("host_overhead") or 0.0)
    topo.fresh_memory = float(spec.get("fresh_memory") or 0.0)
    topo.fresh_from = spec.get("fresh_from") or FRESH_BYTES
    topo.memcpy = float(spec.get("memcpy") or 0.0)
    topo.check_overhead = float(spec.get("check_overhead") or 0.0)
    topo.call_overhead = float(spec.get("call_overhead") or 0.0)
    topo.host_cores = spec.get("host_cores")
    for key in ("rank_bandwidth", "host_bandwidth"):
        value = spec.get(key)
        setattr(topo, key, None if value is None else float(value))
    topo.ranks_per_host = spec.get("ranks_per_host")
    topo.link_queues = bool(spec.get("link_queues"))
    topo.flows = bool(spec.get("flows"))
    topo.send_buffer = int(spec.get("send_buffer", 0))
    return topo


def load_topology(path: str | Path, size: int) -> Topology:
    """The :class:`Topology` of ``size`` ranks described by the topology file at ``path``."""
    return topology_from_spec(read_topology_file(path), size)
