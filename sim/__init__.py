"""The CPU simulator backend: ``get_device("sim")`` (entry point ``sim = "sim:BACKEND"``).

Importing the package registers the CPU reference kernels of the ``ascendgraph`` ops. The one
exception is the facade's launcher process, ``python -m sim.facade -- CMD``, which only starts
CMD and imports nothing heavy (`sim.launcher_process`); CMD imports the package whole.
"""

from sim.launcher_process import is_facade_launcher

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

if not is_facade_launcher():
    from sim.backend import BACKEND
    from sim.device import KernelRecord, SimDevice, SimPoolHandle
    from sim.faults import FaultPlan
    from sim.kernels import register_cpu_kernels
    from ascendgraph.dynamo_gate import defer_torch_dynamo_guards
    from sim.profiles import PROFILES, SimProfile, get_profile, load_profile

    register_cpu_kernels()
    # torch's meta kernels in Python (shape-only warm-ups call them) need not import Dynamo.
    defer_torch_dynamo_guards()
