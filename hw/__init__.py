"""The torch_npu backend: ``get_device("npu")`` (entry point ``npu = "hw:BACKEND"``).

Importing this package never imports torch_npu: ``BACKEND.availability()`` does, once,
behind a guard that turns every failure (torch_npu not installed, CANN or the driver
missing, torch's backend-autoload error) into a one-line reason with what to do.
``BACKEND.create(**options)`` builds an `hw.device.NpuDevice` (options: device_index,
soc, stream_limit) and registers the NPU kernels of the ``ascendgraph`` ops.

Modules: ``api`` (every torch_npu attribute used, as data, and the import guard),
``device`` (NpuDevice), ``kernels`` (PrivateUse1 kernels over torch_npu's fused ops),
``reference`` (capture-safe fallback formulas), ``soc`` (SoC generation from the device
name), ``profiler`` (torch_npu.profiler delegation), ``calibrate`` (measure a real stack
and write a profile the simulator loads).
"""

from hw.api import disable_backend_autoload

# With torch_npu installed but CANN missing, torch's backend autoload makes a plain
# `import torch` fail: switch it off before this package (or anything after it) imports torch.
disable_backend_autoload()

from typing import cast  # noqa: E402

from ascendgraph.device import DeviceBackend, Device  # noqa: E402

__all__ = ["BACKEND", "availability"]


def availability() -> tuple[bool, str]:
    """(usable, reason); never raises. Imports torch_npu at most once per process."""
    from hw import api

    try:
        reason = api.unavailable_reason()
        if reason:
            return False, reason
        npu = api.torch_npu_namespace()
        count = int(npu.call(api.DEVICE_COUNT))
        version = npu.get(api.VERSION) if npu.has(api.VERSION) else "unknown"
    except Exception as exc:  # a broken installation is "unavailable", with the reason
        return False, f"torch_npu failed while probing the NPUs ({type(exc).__name__}: {' '.join(str(exc).split())})"
    return True, f"torch_npu {version} sees {count} NPU(s)"


def _create(**options: object) -> Device:
    from hw.device import create_npu_device

    # NpuDevice.graph() takes its own NpuGraph (from new_graph()), narrower than the protocol's Graph
    return cast(Device, create_npu_device(**options))


BACKEND = DeviceBackend(
    name="npu",
    create=_create,
    availability=availability,
    description="Ascend NPU through torch_npu (ACL graphs, task-group parameter update, fused kernels)",
)
