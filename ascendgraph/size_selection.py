"""The workload-aware size selection for large inputs: the optimum `ascendgraph.sizes.select_sizes`
finds with its plain dynamic programme, in O(n * R) instead of O(n * C^2), and a bound on that
work checked up front (thousands of sizes and a budget of thousands: refused with the reason,
not hours of work or a MemoryError)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from ascendgraph.errors import ConfigError

__all__ = ["EXACT_SELECTION_WORK", "MAX_SELECTION_WORK", "select_sizes_fast"]

# `select_sizes` runs its plain O(n * C^2) dynamic programme up to this much work (every small
# case, so the selections tests pin stay the same); beyond it the same optimum in O(n * R).
EXACT_SELECTION_WORK = 2_000_000
# The fast path refuses (up front, with the reason) beyond this much work: seconds, not hours.
MAX_SELECTION_WORK = 3_000_000


def select_sizes_fast(ordered: Sequence[int], n: int, counts: Mapping[int, int]) -> list[int]:
    """The optimum of `select_sizes` for large inputs.

    Only sizes that some batch pads to can matter (any other chosen size can move down to the
    smallest candidate at or above the largest batch it serves, at no cost): R of them, plus the
    largest. Then best_k[j] = min_i best_{k-1}[i] + (cnt[j] - cnt[i]) * size[j] is a lower
    envelope of lines (slope -cnt[i], intercept best_{k-1}[i]) queried at increasing sizes:
    a monotone convex-hull pass, O(R) per k, O(n * R) in all (n at most R).
    """
    import bisect

    largest = ordered[-1]
    useful = {ordered[bisect.bisect_left(ordered, t)] for t in counts}
    sizes = sorted(useful | {largest})
    if n >= len(sizes):
        return sizes
    work = n * len(sizes)
    if work > MAX_SELECTION_WORK:
        raise ConfigError(
            f"selecting {n} of {len(sizes)} capture sizes that batches pad to is {work} steps of work, more than "
            f"{MAX_SELECTION_WORK}: lower the budget (--budget {max(1, MAX_SELECTION_WORK // len(sizes))} or less) "
            "or configure fewer capture sizes", key="budget")
    cnt: list[int] = []
    total = 0
    tokens = sorted(counts)
    position = 0
    for size in sizes:
        while position < len(tokens) and tokens[position] <= size:
            total += counts[tokens[position]]
            position += 1
        cnt.append(total)
    count = len(sizes)
    previous: list[Optional[int]] = [cnt[j] * sizes[j] for j in range(count)]
    parents: list[list[int]] = [[-1] * count]
    best_at_last = [previous[-1]]
    for _ in range(2, n + 1):
        current: list[Optional[int]] = [None] * count
        parent = [-1] * count
        hull: list[tuple[int, int, int]] = []  # (slope, intercept, index), slopes strictly decreasing
        pointer = 0
        for j in range(count):
            i = j - 1
            intercept = previous[i] if i >= 0 else None
            if intercept is not None:
                line = (-cnt[i], intercept, i)
                dominated = False  # a line of the same slope with a lower intercept is kept instead
                while hull and hull[-1][0] == line[0]:
                    if hull[-1][1] <= line[1]:
                        dominated = True
                        break
                    hull.pop()
                if not dominated:
                    while len(hull) >= 2 and _line_not_needed(hull[-2], hull[-1], line):
                        hull.pop()
                    hull.append(line)
                pointer = min(pointer, len(hull) - 1) if hull else 0
            if not hull:
                continue
            x = sizes[j]
            while pointer + 1 < len(hull) and \
                    hull[pointer + 1][0] * x + hull[pointer + 1][1] <= hull[pointer][0] * x + hull[pointer][1]:
                pointer += 1
            slope, intercept, index = hull[pointer]
            current[j] = slope * x + intercept + cnt[j] * x
            parent[j] = index
        parents.append(parent)
        best_at_last.append(current[-1])
        previous = current
    finite = [(value, k + 1) for k, value in enumerate(best_at_last) if value is not None]
    _, k_best = min(finite)
    chosen = []
    j, k = count - 1, k_best
    while j != -1 and k >= 1:
        chosen.append(sizes[j])
        j = parents[k - 1][j]
        k -= 1
    return sorted(chosen)


def _line_not_needed(first: tuple[int, int, int], middle: tuple[int, int, int], last: tuple[int, int, int]) -> bool:
    """On a lower envelope with decreasing slopes, ``middle`` is never the minimum once ``last``
    is added (exact integer test of the intersections)."""
    (m1, b1, _), (m2, b2, _), (m3, b3, _) = first, middle, last
    return (b3 - b1) * (m1 - m2) <= (b2 - b1) * (m1 - m3)
