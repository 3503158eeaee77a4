"""Device scenarios: one named use or misuse of the device API each (`DEVICE_ACTIONS`)."""

from __future__ import annotations

import random
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from ascendgraph.tools.scenario.model import BOOL, POSITIVE, Check, Scenario, _one_of
from ascendgraph.tools.scenario.observation import (
    _compare_figures, _device_lost, _exception_matches, _figures, _Observation, _sim_device,
)

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.device import Device


# --------------------------------------------------------------------------- device actions
# Theory: one named misuse (or one plain use) of the device API, small enough to read in a
# breath. An action creates its graphs through the context (so they are released after),
# calls ``ctx.checkpoint()`` right before the step that may fail (the resources invariant
# compares the device after a failure with that checkpoint), and raises the device's
# error, or NumericalMismatch when a replay produced a wrong value.


class _ActionContext:
    def __init__(self, device: "Device") -> None:
        self.device = device
        self.graphs: list[Any] = []
        self.wrappers: list[Any] = []
        self.mark: Optional[dict[str, int]] = None

    def new_graph(self) -> Any:
        graph = self.device.new_graph()
        self.graphs.append(graph)
        return graph

    def checkpoint(self) -> None:
        self.mark = _figures(self.device.stats())

    def release(self) -> None:
        for wrapper in self.wrappers:
            wrapper.release()
        for graph in self.graphs:
            try:
                graph.reset()
            except Exception:  # a lost device refuses everything
                pass
        self.graphs.clear()
        self.wrappers.clear()


def _expect_values(actual: Any, expected: Any, what: str) -> None:
    import torch

    from ascendgraph.errors import NumericalMismatch

    if not torch.equal(actual, expected):
        raise NumericalMismatch(f"{what}: replay gave {actual.tolist()}, expected {expected.tolist()}")


def _action_capture_graphs(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Capture ``count`` small graphs on one pool, replay them with new input, check each."""
    import torch

    device = ctx.device
    pool = device.graph_pool_handle() if args["shared_pool"] else None
    x = torch.arange(4, dtype=torch.float32)
    outputs = []
    for index in range(args["count"]):
        graph = ctx.new_graph()
        ctx.checkpoint()
        with device.graph(graph, pool=pool, graph_kind=args["graph_kind"]):
            outputs.append(x * (index + 2) + 1)
    x.copy_(torch.full((4,), 3.0))
    for graph in ctx.graphs:
        ctx.checkpoint()
        graph.replay()
    device.synchronize()
    for index, out in enumerate(outputs):
        _expect_values(out, torch.full((4,), 3.0 * (index + 2) + 1), f"graph {index}")


_HOST_SYNCS: Mapping[str, Callable[[Any], Any]] = {
    "item": lambda t: t.sum().item(),
    "tolist": lambda t: t.tolist(),
    "cpu": lambda t: t.cpu(),
    "bool": lambda t: bool(t.sum() > 0),
    "nonzero": lambda t: t.nonzero(),
}


def _action_host_sync(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Read a device value on the host (``call``) inside a captured region."""
    import torch

    device = ctx.device
    x = torch.ones(4)
    graph = ctx.new_graph()
    ctx.checkpoint()
    with device.graph(graph):
        y = x * 2
        if args["call"] == "synchronize":
            device.synchronize()
        else:
            _HOST_SYNCS[args["call"]](y)


def _action_capture_on_default_stream(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Capture on the default stream instead of a side stream."""
    import torch

    device = ctx.device
    x = torch.ones(4)
    graph = ctx.new_graph()
    ctx.checkpoint()
    with device.graph(graph, stream=device.default_stream()):
        x + 1


def _action_replay_before_capture(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Replay a graph that was never captured."""
    graph = ctx.new_graph()
    ctx.checkpoint()
    graph.replay()


def _action_capture_twice(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Capture a second time into a graph that already holds a capture."""
    import torch

    device = ctx.device
    x = torch.ones(4)
    graph = ctx.new_graph()
    with device.graph(graph):
        x + 1
    ctx.checkpoint()
    with device.graph(graph):
        x + 2


def _action_rng_in_capture(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Draw random numbers inside a captured region."""
    import torch

    device = ctx.device
    graph = ctx.new_graph()
    ctx.checkpoint()
    with device.graph(graph):
        torch.rand(4, generator=torch.Generator().manual_seed(0))


def _action_wrapper_replay(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """A FULL GraphWrapper in debug mode: capture with one input tensor, replay with another
    (``new_address``) or the same one refilled."""
    import torch

    from ascendgraph.compile.graph_wrapper import GraphOptions, GraphWrapper
    from ascendgraph.dispatch import BatchDescriptor
    from ascendgraph.forward_context import ForwardContext, set_forward_context
    from ascendgraph.modes import GraphMode

    device = ctx.device
    wrapper = GraphWrapper(lambda t: t * 2 + 1, GraphMode.FULL, device, options=GraphOptions(debug=True, label="scenario"))
    ctx.wrappers.append(wrapper)
    context = ForwardContext(GraphMode.FULL, BatchDescriptor(4), None, {})
    captured_input = torch.zeros(4)
    with set_forward_context(context):
        ctx.checkpoint()
        wrapper(captured_input)
        replay_input = torch.zeros(4) if args["new_address"] else captured_input
        replay_input.copy_(torch.full((4,), 3.0))
        ctx.checkpoint()
        out = wrapper(replay_input)
    device.synchronize()
    _expect_values(out, torch.full((4,), 7.0), "wrapper replay")


def _action_external_event(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """A graph that waits on an ExternalEvent; replay it and synchronize, recording the
    event in between only when ``record`` is true."""
    import torch

    device = ctx.device
    event = device.new_external_event()
    x = torch.ones(4)
    graph = ctx.new_graph()
    with device.graph(graph):
        event.wait()
        event.reset()
        out = x + 1
    x.copy_(torch.full((4,), 5.0))
    graph.replay()
    if args["record"]:
        event.record(device.new_stream())
    ctx.checkpoint()
    device.synchronize()
    _expect_values(out, torch.full((4,), 6.0), "graph after the event")


@dataclass(frozen=True)
class DeviceAction:
    """A named device action: what it does, its parameters (check, default, description)."""

    name: str
    run: Callable[[_ActionContext, Mapping[str, Any]], None]
    description: str
    params: Mapping[str, tuple[Check, Any, str]] = field(default_factory=dict)


DEVICE_ACTIONS: Mapping[str, DeviceAction] = {
    action.name: action
    for action in (
        DeviceAction(
            "capture_graphs", _action_capture_graphs,
            "capture `count` small graphs, replay them with new input and check every value",
            {
                "count": (POSITIVE, 3, "how many graphs"),
                "graph_kind": (_one_of("full", "piecewise"), "full", "the stream charge"),
                "shared_pool": (BOOL, True, "capture into one graph_pool_handle()"),
            },
        ),
        DeviceAction(
            "host_sync_in_capture", _action_host_sync,
            "read a value on the host inside a captured region",
            {"call": (_one_of(*_HOST_SYNCS, "synchronize"), "item", "the host synchronization")},
        ),
        DeviceAction("capture_on_default_stream", _action_capture_on_default_stream,
                     "capture on the default stream"),
        DeviceAction("replay_before_capture", _action_replay_before_capture,
                     "replay a graph that was never captured"),
        DeviceAction("capture_twice", _action_capture_twice,
                     "capture again into a graph that already owns a capture"),
        DeviceAction("rng_in_capture", _action_rng_in_capture,
                     "draw random numbers inside a captured region"),
        DeviceAction(
            "wrapper_replay", _action_wrapper_replay,
            "a debug-mode FULL GraphWrapper replayed with the captured input or a new tensor",
            {"new_address": (BOOL, True, "replay with a different input tensor")},
        ),
        DeviceAction(
            "external_event_replay", _action_external_event,
            "replay a graph waiting on an ExternalEvent, then synchronize",
            {"record": (BOOL, False, "record the event before synchronizing")},
        ),
    )
}


def _run_device_action(scenario: Scenario) -> _Observation:
    obs = _Observation()
    try:
        device = _sim_device(scenario, soc="A2", stream_limit=scenario.device.stream_limit)
    except Exception as exc:
        obs.error, obs.traceback = exc, traceback.format_exc()
        obs.skipped["resources"] = "no device was built"
        return obs
    obs.device = device
    ctx = _ActionContext(device)
    initial = _figures(device.stats())
    resources: list[str] = []
    try:
        DEVICE_ACTIONS[scenario.action or ""].run(ctx, scenario.action_args)
    except Exception as exc:
        obs.error, obs.traceback = exc, traceback.format_exc()
        exc.__traceback__ = None  # drop the frames: they hold the action's tensors and graphs
        if ctx.mark is not None and not _device_lost(device):
            resources += _compare_figures("after the failure", ctx.mark, _figures(device.stats()))
    finally:
        ctx.release()
    if _device_lost(device):
        obs.skipped["resources"] = "the device was lost (every later call on it fails; a new device is needed)"
    else:
        resources += _compare_figures("after releasing the action's graphs", initial, _figures(device.stats()))
        obs.invariant_notes["resources"] = resources
    return obs


def _check_device_expectations(scenario: Scenario, obs: _Observation) -> list[str]:
    expect = scenario.expect
    misses = []
    if expect.error_type:
        if obs.error is None:
            misses.append(f"error_type: expected {expect.error_type}, but there was no error")
        elif not _exception_matches(obs.error, expect.error_type):
            misses.append(f"error_type: expected {expect.error_type}, got {type(obs.error).__name__}")
    for fragment in expect.message:
        if obs.error is None or fragment not in str(obs.error):
            misses.append(f"message: {fragment!r} not in the error text")
    return misses
