"""The simulator's public names in one place: ``simdist.sim.simulate``, ``simdist.sim.compute``, strategies."""

from simdist.api import compute as compute
from simdist.launch._launch import enumerate_schedules as enumerate_schedules
from simdist.core._topology import TOPOLOGIES as TOPOLOGIES
from simdist.core._topology import Topology as Topology
from simdist.backends.sim import PCTStrategy as PCTStrategy
from simdist.backends.sim import RandomStrategy as RandomStrategy
from simdist.backends.sim import ReplayStrategy as ReplayStrategy
from simdist.backends.sim import RoundRobinStrategy as RoundRobinStrategy
from simdist.backends.sim import SimResult as SimResult
from simdist.backends.sim import Strategy as Strategy
from simdist.backends.sim import simulate as simulate

__all__ = [
    "compute",
    "enumerate_schedules",
    "simulate",
    "TOPOLOGIES",
    "Topology",
    "SimResult",
    "Strategy",
    "RandomStrategy",
    "RoundRobinStrategy",
    "PCTStrategy",
    "ReplayStrategy",
]
