"""The simulator as an ascendgraph device backend: `BACKEND` (``get_device("sim")``)."""

from typing import cast

from ascendgraph.device import Device, DeviceBackend
from sim.device import SimDevice
from sim.faults import FaultPlan
from sim.profiles import get_profile

__all__ = ["BACKEND"]


def _create(**options: object) -> Device:
    # SimDevice checks its options itself (ConfigError naming a bad one); its graph() takes its own
    # SimGraph (from new_graph()), narrower than the protocol's Graph
    return cast(Device, SimDevice(**options))  # type: ignore[arg-type]  # the options are checked by SimDevice


def _check_options(*, profile: object = None, faults: object = None, **_other: object) -> None:
    """What `SimDevice` would refuse in its profile and fault plan, without building a device."""
    if profile is not None:
        get_profile(profile)  # type: ignore[arg-type]  # get_profile reports a bad value as a ConfigError naming it
    if isinstance(faults, str):
        FaultPlan.parse(faults)


BACKEND = DeviceBackend(
    name="sim",
    create=_create,
    check_options=_check_options,
    availability=lambda: (True, "CPU simulator"),
    description="CPU simulator of torch_npu graph capture/replay (ascendgraph issue 3)",
)
