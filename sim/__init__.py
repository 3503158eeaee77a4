"""The CPU simulator backend: ``get_device("sim")`` (entry point ``sim = "sim:BACKEND"``).

Importing the package registers the CPU reference kernels of the ``ascendgraph`` ops.
"""

from ascendgraph.device import DeviceBackend
from sim.device import KernelRecord, SimDevice, SimPoolHandle
from sim.faults import FaultPlan
from sim.kernels import register_cpu_kernels
from sim.profiles import PROFILES, SimProfile, get_profile, load_profile

__all__ = [
    "BACKEND",
    "SimDevice",
    "SimPoolHandle",
    "KernelRecord",
    "FaultPlan",
    "PROFILES",
    "SimProfile",
    "get_profile",
    "load_profile",
    "register_cpu_kernels",
]

register_cpu_kernels()


def _create(**options: object) -> SimDevice:
    return SimDevice(**options)  # type: ignore[arg-type]


BACKEND = DeviceBackend(
    name="sim",
    create=_create,
    availability=lambda: (True, "CPU simulator"),
    description="CPU simulator of torch_npu graph capture/replay (ascendgraph issue 3)",
)
