"""The ``--plot`` figure: padding waste per batch size for both selections over the workload's
histogram (needs matplotlib), written atomically."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from ascendgraph.errors import ConfigError
from ascendgraph.readers import check_output_path, write_output
from ascendgraph.sizes import pad_num_tokens
from ascendgraph.tools.plan.model import PlanResult
from ascendgraph.tools.plan.formatting import percent

__all__ = ["PLOT_MISSING", "check_plot_path", "matplotlib_available", "padding_waste_figure", "plot_padding_waste"]

PLOT_MISSING = "--plot needs matplotlib, which is not installed; install it with: pip install 'ascendgraph[plot]'"


def matplotlib_available() -> bool:
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


# The y axis stops at the waste of all but the rarest batches (a few tiny batches padded to the
# smallest capture size would otherwise stretch it to 1000 %); what is cut off is said on the plot.
Y_QUANTILE = 0.95
Y_FLOOR = 10.0  # percent: the axis never gets shorter than this
Y_HEADROOM = 1.15


def _waste_percent(batch: int, sizes: list[int]) -> float:
    return ((pad_num_tokens(batch, sizes) or batch) / batch - 1) * 100


def _y_top(result: PlanResult, largest: int) -> float:
    assert result.even is not None and result.aware is not None
    served = sorted(t for t in result.workload.counted if t <= largest)
    if not served:
        return 100.0
    values = sorted(_waste_percent(t, s.sizes) for t in served for s in (result.even, result.aware))
    quantile = values[min(len(values) - 1, int(Y_QUANTILE * len(values)))]
    return max(Y_FLOOR, quantile * Y_HEADROOM)


def padding_waste_figure(result: PlanResult) -> tuple[Any, list[str]]:
    """The figure (matplotlib) and the notes that say what it does not show."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(PLOT_MISSING, key="plot") from None
    assert result.even is not None and result.aware is not None
    largest = max(result.even.sizes)
    xs = list(range(1, largest + 1))
    figure, axis = plt.subplots(figsize=(9, 5))
    counts = [0] * (largest + 1)
    for t in result.workload.counted:
        if t <= largest:
            counts[t] += 1
    twin = axis.twinx()
    bars = twin.bar(xs, counts[1:], width=1.0, color="0.85", label="workload batches")
    twin.set_ylabel("batches in the workload")
    axis.set_zorder(twin.get_zorder() + 1)
    axis.patch.set_visible(False)
    top = _y_top(result, largest)
    clipped = 0
    handles = []
    for selection, label, colour in ((result.even, "even sampling", "tab:orange"),
                                     (result.aware, "workload-aware", "tab:blue")):
        waste = [_waste_percent(t, selection.sizes) for t in xs]
        clipped = max(clipped, sum(1 for t, w in zip(xs, waste) if w > top and counts[t]))
        (line,) = axis.step(xs, waste, where="post", color=colour,
                            label=f"{label}: {percent(selection.padding_waste)} on the workload")
        handles.append(line)
    axis.set_ylim(0, top)
    axis.set_xscale("log", base=2)  # batch sizes cluster at the small end
    axis.set_xlabel("batch size (tokens, log scale)")
    axis.set_ylabel("padding waste (%)")
    axis.set_title(f"{result.resolution.config.model.name}: padding waste per batch size, {result.budget} capture sizes")
    notes = []
    if clipped:
        notes.append(f"--plot: the y axis stops at {top:.0f} %; {clipped} batch size(s) of the workload waste more")
    beyond = sum(1 for t in result.workload.counted if t > largest)
    if beyond:
        notes.append(f"--plot: {beyond} batch(es) above {largest} tokens (the largest capture size) run eagerly "
                     "and are not drawn")
    # The legend sits under the axes, so it never covers a bar or a line.
    axis.legend(handles=[*handles, bars], loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    if notes:
        figure.text(0.01, 0.01, "; ".join(n.removeprefix("--plot: ") for n in notes), fontsize=8, color="0.3")
    figure.tight_layout(rect=(0, 0.04 if notes else 0, 1, 1))
    return figure, notes


def plot_padding_waste(result: PlanResult, path: str) -> list[str]:
    """Padding waste per batch size for both selections, over the workload's histogram, written
    to ``path`` (mode 0666 minus the umask, like any file the user creates); returns the notes
    saying what the figure does not show."""
    import matplotlib.pyplot as plt

    figure, notes = padding_waste_figure(result)
    try:
        _save_atomically(figure, path)
    finally:
        plt.close(figure)
    return notes


def _save_atomically(figure: Any, path: str) -> None:
    """Write the PNG through `ascendgraph.readers.write_output`: to a temporary file next to
    ``path``, then renamed over it, only ever over a regular file; a failure or a signal leaves
    no partial or temporary file."""

    def save(temporary: str) -> None:
        figure.savefig(temporary, dpi=110, format="png")
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes it 0600; the user's umask decides, as for `>`

    try:
        write_output(path, save, f"--plot {path}", key="plot", suffix=".tmp.png")
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write it: {exc.strerror or exc}", key="plot") from None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
    check_output_path(path, f"--plot {path}", key="plot")  # never a device, FIFO or socket (/dev/null)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"--plot {path}: folder {directory} is not writable; pick another path ({example})",
                          key="plot")
    return path
