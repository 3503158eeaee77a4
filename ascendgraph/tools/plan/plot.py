"""The ``--plot`` figure: padding waste per batch size for both selections over the workload's
histogram (needs matplotlib), written atomically."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import Any

from ascendgraph.errors import ConfigError
from ascendgraph.sizes import pad_num_tokens
from ascendgraph.tools.plan.model import PlanResult
from ascendgraph.tools.plan.formatting import percent

__all__ = ["PLOT_MISSING", "check_plot_path", "matplotlib_available", "plot_padding_waste"]

PLOT_MISSING = "--plot needs matplotlib, which is not installed; install it with: pip install 'ascendgraph[plot]'"


def matplotlib_available() -> bool:
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def plot_padding_waste(result: PlanResult, path: str) -> None:
    """Padding waste per batch size for both selections, over the workload's histogram."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(PLOT_MISSING, key="plot") from None
    assert result.even is not None and result.aware is not None
    largest = max(result.even.sizes)
    xs = list(range(1, largest + 1))
    figure, axis = plt.subplots(figsize=(9, 4.5))
    counts = [0] * (largest + 1)
    for t in result.workload.counted:
        if t <= largest:
            counts[t] += 1
    twin = axis.twinx()
    twin.bar(xs, counts[1:], width=1.0, color="0.85", label="workload batches")
    twin.set_ylabel("batches in the workload")
    axis.set_zorder(twin.get_zorder() + 1)
    axis.patch.set_visible(False)
    for selection, label, colour in ((result.even, "even sampling", "tab:orange"),
                                     (result.aware, "workload-aware", "tab:blue")):
        waste = [(pad_num_tokens(t, selection.sizes) or t) / t - 1 for t in xs]
        axis.step(xs, [w * 100 for w in waste], where="post", color=colour,
                  label=f"{label}: {percent(selection.padding_waste)} on the workload")
    axis.set_xscale("log", base=2)  # batch sizes cluster at the small end
    axis.set_xlabel("batch size (tokens, log scale)")
    axis.set_ylabel("padding waste (%)")
    axis.set_title(f"{result.resolution.config.model.name}: padding waste per batch size, {result.budget} capture sizes")
    axis.legend(loc="upper right")
    figure.tight_layout()
    try:
        _save_atomically(figure, path)
    finally:
        plt.close(figure)


def _save_atomically(figure: Any, path: str) -> None:
    """Write the PNG to a temporary file next to ``path``, then rename: a failure leaves no partial file."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp.png", dir=directory)
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write in {directory}: {exc.strerror or exc}", key="plot") from None
    os.close(handle)
    try:
        figure.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write it: {exc.strerror or exc}", key="plot") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_plot_path(path: str) -> str:
    """The ``--plot`` target, checked before any work: a file path whose folder exists and is writable."""
    example = "e.g. --plot waste.png"
    if not path.strip():
        raise ConfigError(f"--plot needs the path of a PNG file to write, got {path!r} ({example})", key="plot")
    if os.path.isdir(path):
        raise ConfigError(
            f"--plot {path}: is a folder; give a file path in it, e.g. --plot {os.path.join(path, 'waste.png')}",
            key="plot",
        )
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(directory):
        raise ConfigError(f"--plot {path}: folder {directory} does not exist; create it or pick another path",
                          key="plot")
    if not os.path.isdir(directory):
        raise ConfigError(f"--plot {path}: {directory} is a file, not a folder; pick another path ({example})",
                          key="plot")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"--plot {path}: folder {directory} is not writable; pick another path ({example})",
                          key="plot")
    return path
