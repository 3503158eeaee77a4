"""The in-process collective fabric: many ranks, one deterministic scheduler.

Theory of operation. Each rank runs a *program*: a generator that yields a `Collective`
whenever the rank would call a collective and receives its result back. The fabric steps
the runnable ranks one at a time in an order drawn from its seeded generator, so a seed
reproduces a run exactly; a rank that yields is parked at the meeting point named by its
group (kind and members) and its sequence number in that group. When every member of a
group has arrived, the fingerprints are checked against
`ascendgraph.parallel.fingerprints.COMPATIBILITY_RULES`:

* a broken rule raises ``CollectiveMismatch`` (the rule, its source, each rank's fingerprint);
* otherwise the collective completes: all-reduces sum (or take the maximum of) their rows,
  and every member resumes at the latest arrival on its virtual clock.

Virtual clocks: each rank's clock advances by the local time it reports with each
collective (``Collective.local_us``: what its device spent since its last collective,
delays injected by the fault plan included). A member that waits longer than the timeout
(HCCL's execution timeout) makes the fabric raise ``CollectiveTimeout`` naming the
straggler. When every live rank is parked and no meeting can complete, the fabric raises
``CollectiveDeadlock``; a rank that hangs (``RankHung``) never arrives, so its peers time
out naming it. Both reports are flight-recorder style: per rank, the pending fingerprint and
the last collectives it completed.

Post-sync invariant: a program may yield a `Decision` after a DP sync; it does not block.
When every member of the group has recorded its n-th decision they must be equal (mode,
graph key, ``num_tokens_across_dp``), else ``CollectiveMismatch`` (rule
``post_sync_invariant``); a decision left unmatched when the run ends (a surplus) is the
same error. Everything lives on the fabric object.

Two drivers share these meetings. `Fabric.run` steps generator programs under the seeded
scheduler (the rank simulation of ``ascendgraph run``). `FabricThreads` runs one *thread* per
rank (the ``torch.distributed`` backend of `sim.process_group`, where each rank runs vLLM's
and vLLM Ascend's own code): a collective blocks its thread until the meeting completes; when
every live thread is blocked and no meeting can complete, the deadlock (or the timeout naming a
failed straggler) is raised in every waiting thread. There, determinism comes from the
meetings (every collective is a rendezvous, combined in rank order), not from the threads'
interleaving. Given a `RankSwitch`, `FabricThreads` runs one rank thread at a time: a thread
holds the baton from its start until it waits in a collective (or ends), and the switch's
``leave`` / ``enter`` run as the baton changes hands, so a caller can give each rank its own
copy of state that its code keeps per process (vLLM's module globals: `sim.vllm_ranks`).
"""

from __future__ import annotations

import random
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Mapping, Optional, Protocol, Union

from ascendgraph.errors import (
    CaptureError,
    CollectiveDeadlock,
    CollectiveError,
    CollectiveMismatch,
    CollectiveTimeout,
    GraphHang,
)
from ascendgraph.parallel.fingerprints import EAGER, Fingerprint, check_meeting
from ascendgraph.parallel.layout import ParallelLayout

__all__ = ["Collective", "Decision", "RankHung", "Fabric", "FabricStats", "FabricThreads", "Program", "RankSwitch",
           "failing_rank"]

HISTORY = 8  # completed collectives kept per rank for the flight record


@dataclass(frozen=True)
class Collective:
    """One collective call of a rank. ``rows`` is an all-reduce's payload (int rows). A caller
    with its own data (the torch.distributed backend) gives ``members`` (global ranks, when the
    group is not one of the layout's), ``payload`` and ``combine``: called once, by the last
    arrival, with every member's payload by rank, it returns each member's result by rank."""

    group: str
    op: str
    shape: tuple[int, ...]
    dtype: str = "int32"
    how: str = EAGER
    site: str = ""
    params: tuple[tuple[str, int], ...] = ()
    rows: Optional[list[list[int]]] = None
    reduce: str = "sum"  # "sum" | "max"
    local_us: float = 0.0
    members: Optional[tuple[int, ...]] = None
    payload: Any = field(default=None, compare=False, repr=False)
    combine: Optional[Callable[[Mapping[int, Any]], Mapping[int, Any]]] = field(default=None, compare=False,
                                                                                  repr=False)


@dataclass(frozen=True)
class Decision:
    """A rank's step decision after a DP sync (checked, never waited on)."""

    group: str
    value: tuple[Any, ...]
    sp_tp: int = 1  # > 1: sequence parallelism needs the padded size to be a multiple of tp
    padded: int = 0
    members: Optional[tuple[int, ...]] = None  # None: the layout's group


class RankHung(GraphHang):
    """Raised inside a rank program: the rank stops making progress (an injected hang; any
    GraphHang a rank program raises counts as one)."""


Program = Generator[Union[Collective, Decision], Any, Any]


@dataclass
class FabricStats:
    """What a run of the fabric did: collectives met per group kind, per-rank clocks."""

    met: dict[str, int] = field(default_factory=dict)
    met_by_rank: dict[int, int] = field(default_factory=dict)
    clocks_us: dict[int, float] = field(default_factory=dict)
    max_wait_us: float = 0.0
    results: dict[int, Any] = field(default_factory=dict)
    # The rank whose own failure is the run's error (`failing_rank`); None when the run
    # succeeded or the fabric itself found the error (a mismatch, deadlock or timeout names
    # its ranks). The exception is raised as the rank raised it, never annotated.
    failed_rank: Optional[int] = None


@dataclass
class _Arrival:
    fingerprint: Fingerprint
    collective: Collective
    at_us: float


def failing_rank(failures: Mapping[int, BaseException]) -> int:
    """The rank whose failure is the run's error: the lowest rank that failed on its own, not
    one that gave up because another failed (a `CaptureError` with ``peer_abort``)."""
    originals = [r for r, exc in sorted(failures.items()) if not (isinstance(exc, CaptureError) and exc.peer_abort)]
    return (originals or sorted(failures))[0]


class Fabric:
    """Steps rank programs under one seeded scheduler (see the module docstring)."""

    # What a rank program yields (ascendgraph.device.RankFabric): the runtime builds them without importing sim.
    collective_type = Collective
    decision_type = Decision

    def __init__(self, layout: ParallelLayout, *, seed: int = 0, timeout_s: Optional[float] = 1836.0) -> None:
        self.layout = layout
        self.timeout_us = None if timeout_s is None else timeout_s * 1e6
        self._random = random.Random(seed)
        self._seq: dict[tuple[int, tuple[str, tuple[int, ...]]], int] = {}
        self._meetings: dict[tuple[str, tuple[int, ...], int], dict[int, _Arrival]] = {}
        self._pending: dict[int, Fingerprint] = {}
        self._history: dict[int, deque[Fingerprint]] = {}
        self._decisions: dict[tuple[str, tuple[int, ...]], dict[int, list[Decision]]] = {}
        self._checked: dict[tuple[str, tuple[int, ...]], int] = {}
        self.clock_us: dict[int, float] = {}
        self.failures: dict[int, BaseException] = {}
        self.stats = FabricStats()

    # ------------------------------------------------------------------ running
    def run(self, programs: Mapping[int, Program]) -> FabricStats:
        """Run every program to its end; raise what the fabric detects."""
        runnable: dict[int, Any] = {rank: None for rank in programs}  # rank -> value to send
        parked: set[int] = set()
        hung: set[int] = set()
        finished: set[int] = set()
        for rank in programs:
            self.clock_us[rank] = 0.0
            self._history[rank] = deque(maxlen=HISTORY)
        order = sorted(runnable)  # runnable ranks; a pick swaps the last one into its place
        while order:
            index = self._random.randrange(len(order))
            rank = order[index]
            order[index] = order[-1]
            order.pop()
            value = runnable.pop(rank)
            program = programs[rank]
            try:
                item = program.send(value)
                while isinstance(item, Decision):
                    self._decide(rank, item)
                    item = program.send(None)
            except StopIteration as stop:
                finished.add(rank)
                self.stats.results[rank] = stop.value
                continue
            except GraphHang as exc:
                hung.add(rank)
                self.failures[rank] = exc
                continue
            except CollectiveError:
                raise
            except Exception as exc:  # the rank fails: it never arrives anywhere again
                self.failures[rank] = exc
                hung.add(rank)
                continue
            if not isinstance(item, Collective):
                raise TypeError(f"rank {rank} yielded {item!r}; programs yield Collective or Decision")
            parked.add(rank)
            done = self._arrive(rank, item)
            if done is not None:
                for member, result in done.items():
                    parked.discard(member)
                    runnable[member] = result
                    order.append(member)
        self.stats.clocks_us = dict(self.clock_us)
        if parked:
            self._stuck(parked, hung, finished)
        if not self.failures:
            self.check_surplus_decisions()
        if self.failures:  # nobody waits on them: the first original failure is the run's error
            self.stats.failed_rank = failing_rank(self.failures)
            raise self.failures[self.stats.failed_rank]
        return self.stats

    # ------------------------------------------------------------------ meetings
    def _arrive(self, rank: int, call: Collective) -> Optional[dict[int, Any]]:
        members = call.members if call.members is not None else self.layout.group(call.group, rank)
        slot = (rank, (call.group, members))
        seq = self._seq.get(slot, 0)
        self._seq[slot] = seq + 1
        fp = Fingerprint(call.group, members, seq, call.op, tuple(call.shape), call.dtype, call.how,
                         tuple(call.params), call.site)
        self.clock_us[rank] += call.local_us
        key = (call.group, members, seq)
        meeting = self._meetings.setdefault(key, {})
        meeting[rank] = _Arrival(fp, call, self.clock_us[rank])
        self._pending[rank] = fp
        if len(meeting) < len(members):
            return None
        del self._meetings[key]
        fps = {r: a.fingerprint for r, a in meeting.items()}
        violations = check_meeting(fps)
        if violations:
            lines = [f"- {v.rule}: {v.detail} (source: {v.source})" for v in violations]
            record = self.flight_record()
            raise CollectiveMismatch(
                f"collective mismatch at {call.group}#{seq} (ranks {', '.join(map(str, members))}): the ranks "
                "brought incompatible fingerprints; on a cluster they would hang or corrupt each other.\n"
                + "\n".join(lines) + "\n" + self.format_record(record),
                ranks=members, flight_record=record, rules=tuple(v.rule for v in violations),
            )
        latest = max(a.at_us for a in meeting.values())
        straggler = max(meeting, key=lambda r: (meeting[r].at_us, r))
        waits = {r: latest - a.at_us for r, a in meeting.items()}
        self.stats.max_wait_us = max(self.stats.max_wait_us, max(waits.values()))
        if self.timeout_us is not None:
            late = sorted(r for r, w in waits.items() if w > self.timeout_us)
            if late:
                self._timeout(late, straggler, key, waits)
        combine = meeting[rank].collective.combine
        if combine is not None:
            results = dict(combine({r: a.collective.payload for r, a in sorted(meeting.items())}))
        else:
            shared = self._combine(meeting)
            results = {r: shared for r in meeting}
        for r in meeting:
            self.clock_us[r] = latest
            self._history[r].append(fps[r])
            self._pending.pop(r, None)
            self.stats.met_by_rank[r] = self.stats.met_by_rank.get(r, 0) + 1
        self.stats.met[call.group] = self.stats.met.get(call.group, 0) + 1
        return results

    @staticmethod
    def _combine(meeting: Mapping[int, _Arrival]) -> Optional[list[list[int]]]:
        payloads = [a.collective.rows for _, a in sorted(meeting.items()) if a.collective.rows is not None]
        if not payloads:
            return None
        fold = max if next(iter(meeting.values())).collective.reduce == "max" else sum
        return [[fold(column) for column in zip(*(rows[i] for rows in payloads))] for i in range(len(payloads[0]))]

    # ------------------------------------------------------------------ the invariant
    def _decide(self, rank: int, decision: Decision) -> None:
        if decision.sp_tp > 1 and decision.padded % decision.sp_tp:
            record = self.flight_record()
            raise CollectiveMismatch(
                f"post-sync invariant: rank {rank} pads to {decision.padded} tokens, not a multiple of tp="
                f"{decision.sp_tp} as sequence parallelism needs\n" + self.format_record(record),
                ranks=(rank,), flight_record=record, rules=("post_sync_invariant",),
            )
        members = decision.members if decision.members is not None else self.layout.group(decision.group, rank)
        slot = (decision.group, members)
        table = self._decisions.setdefault(slot, {})
        table.setdefault(rank, []).append(decision)
        index = self._checked.get(slot, 0)
        while all(len(table.get(m, [])) > index for m in members):
            values = {m: table[m][index].value for m in members}
            if len(set(values.values())) > 1:
                record = self.flight_record()
                shown = "\n".join(f"  rank {m}: mode, key, num_tokens_across_dp = {v}" for m, v in sorted(values.items()))
                raise CollectiveMismatch(
                    f"post-sync invariant broken at decision {index} of {decision.group} group "
                    f"{list(members)}: after the DP sync every rank must hold the same (mode, key, "
                    f"num_tokens_across_dp)\n{shown}\n" + self.format_record(record),
                    ranks=members, flight_record=record, rules=("post_sync_invariant",),
                )
            index += 1
        self._checked[slot] = index

    def check_surplus_decisions(self) -> None:
        """At the end of a run every member must have made as many post-sync decisions as its
        peers: one left unmatched means a rank ran a DP sync its peers never decided on."""
        for (group, members), table in self._decisions.items():
            counts = {m: len(table.get(m, [])) for m in members}
            if len(set(counts.values())) > 1:
                record = self.flight_record()
                shown = ", ".join(f"rank {m}: {n}" for m, n in sorted(counts.items()))
                raise CollectiveMismatch(
                    f"post-sync invariant: at the end of the run the {group} group {list(members)} made different "
                    f"numbers of post-sync decisions ({shown}); a surplus decision was never matched by the peers\n"
                    + self.format_record(record),
                    ranks=members, flight_record=record, rules=("post_sync_invariant",),
                )

    # ------------------------------------------------------------------ failures
    def _timeout(self, late: list[int], straggler: int, key: tuple, waits: Mapping[int, float]) -> None:
        group, members, seq = key
        record = self.flight_record()
        assert self.timeout_us is not None
        raise CollectiveTimeout(
            f"collective timeout at {group}#{seq}: rank(s) {', '.join(map(str, late))} waited "
            f"{max(waits[r] for r in late) / 1e6:.1f} s, past the {self.timeout_us / 1e6:g} s HCCL_EXEC_TIMEOUT; "
            f"the straggler is rank {straggler}\n" + self.format_record(record),
            straggler=straggler, ranks=tuple(late), flight_record=record,
        )

    def _stuck(self, parked: set[int], hung: set[int], finished: set[int]) -> None:
        record = self.flight_record()
        waiting = {r: self._pending[r] for r in sorted(parked)}
        missing: dict[int, set[int]] = {}
        for rank, fp in waiting.items():
            key = (fp.group, fp.members, fp.seq)
            arrived = set(self._meetings.get(key, {}))
            missing[rank] = set(fp.members) - arrived
        absent = set().union(*missing.values()) if missing else set()
        if absent & hung:
            straggler = min(absent & hung)
            cause = self.failures.get(straggler)
            what = f"failed ({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})" \
                if cause is not None and not isinstance(cause, GraphHang) else "hung"
            raise CollectiveTimeout(
                f"collective timeout: rank(s) {', '.join(map(str, sorted(parked)))} wait for rank {straggler}, which "
                f"{what} and never arrives; HCCL_EXEC_TIMEOUT "
                f"({'never' if self.timeout_us is None else f'{self.timeout_us / 1e6:g} s'}) ends the wait; "
                f"the straggler is rank {straggler}\n" + self.format_record(record),
                straggler=straggler, ranks=tuple(sorted(parked)), flight_record=record,
            )
        why = []
        for rank, fp in waiting.items():
            gone = sorted(missing[rank])
            states = ", ".join(f"{m} ({'finished' if m in finished else 'blocked elsewhere'})" for m in gone)
            why.append(f"  rank {rank} waits in {fp} for {states}")
        raise CollectiveDeadlock(
            "collective deadlock: every live rank is blocked and no group can complete\n" + "\n".join(why) + "\n"
            + self.format_record(record),
            ranks=tuple(sorted(parked)), flight_record=record,
        )

    # ------------------------------------------------------------------ flight record
    def flight_record(self) -> dict[int, dict[str, Any]]:
        return {
            rank: {
                "pending": str(self._pending[rank]) if rank in self._pending else None,
                "last": [str(fp) for fp in self._history.get(rank, ())],
                "clock_us": self.clock_us.get(rank, 0.0),
            }
            for rank in sorted(self.clock_us)
        }

    @staticmethod
    def format_record(record: Mapping[int, Mapping[str, Any]], *, last: int = 3) -> str:
        lines = ["flight record (per rank: pending collective; last completed, newest last):"]
        for rank, entry in record.items():
            recent = list(entry["last"])[-last:]
            lines.append(f"  rank {rank}: pending {entry['pending'] or '-'}; last: {' | '.join(recent) or '-'}")
        return "\n".join(lines)


class RankSwitch(Protocol):
    """What runs as one rank thread hands the baton to another (`FabricThreads`)."""

    def enter(self, rank: int) -> None:
        """``rank``'s thread takes the baton: install its own state."""

    def leave(self, rank: int) -> None:
        """``rank``'s thread gives the baton up (it waits in a collective, or ends): keep its state."""


class FabricThreads:
    """Ranks as threads meeting in one `Fabric` (see the module docstring).

    `run` starts one thread per rank with its callable and joins them; `collective` and
    `decide` are what a rank's thread calls (the torch.distributed backend does). The run's
    error (a mismatch, a deadlock, a timeout naming the straggler, or the first rank's own
    failure) is raised by `run`; every blocked thread is woken with it, so no thread is left
    waiting. With a ``switch``, one rank thread runs at a time (the module docstring)."""

    def __init__(self, fabric: Fabric, *, switch: Optional[RankSwitch] = None) -> None:
        self.fabric = fabric
        self.switch = switch
        self._baton = threading.Lock()
        self._lock = threading.Lock()
        self._wake: dict[int, threading.Event] = {}
        self._results: dict[int, Any] = {}
        self._running: set[int] = set()
        self._parked: set[int] = set()
        self._finished: set[int] = set()
        self._failed: set[int] = set()
        self.error: Optional[BaseException] = None

    # -- what a rank's thread calls -------------------------------------------------
    def collective(self, rank: int, call: Collective) -> Any:
        """Block until ``call`` met its peers; its result for ``rank`` (or raise the run's error)."""
        event = self._wake[rank]
        with self._lock:
            self._raise_if_failed()
            try:
                done = self.fabric._arrive(rank, call)
            except CollectiveError as exc:
                self._fail_all(exc)
                raise
            if done is None:
                self._running.discard(rank)
                self._parked.add(rank)
                event.clear()
                self._check_stuck()
            else:
                for member, result in done.items():
                    self._results[member] = result
                    if member != rank:
                        self._parked.discard(member)
                        self._running.add(member)
                        self._wake[member].set()
        if done is not None:
            return self._results.pop(rank)
        self._give_baton(rank)
        event.wait()
        self._take_baton(rank)
        with self._lock:
            self._raise_if_failed()
            return self._results.pop(rank)

    def _take_baton(self, rank: int) -> None:
        if self.switch is not None:
            self._baton.acquire()
            self.switch.enter(rank)

    def _give_baton(self, rank: int) -> None:
        if self.switch is not None:
            self.switch.leave(rank)
            self._baton.release()

    def decide(self, rank: int, decision: Decision) -> None:
        with self._lock:
            self._raise_if_failed()
            try:
                self.fabric._decide(rank, decision)
            except CollectiveError as exc:
                self._fail_all(exc)
                raise

    # -- the run ----------------------------------------------------------------------
    def run(self, programs: Mapping[int, Callable[[], Any]]) -> FabricStats:
        """Run every rank's callable in its own thread; raise the run's error (see the class)."""
        threads = []
        for rank in programs:
            self.fabric.clock_us[rank] = 0.0
            self.fabric._history[rank] = deque(maxlen=HISTORY)
            self._wake[rank] = threading.Event()
            self._running.add(rank)
        for rank, body in sorted(programs.items()):
            thread = threading.Thread(target=self._thread, args=(rank, body), name=f"fabric-rank-{rank}", daemon=True)
            threads.append(thread)
            thread.start()
        for thread in threads:
            thread.join()
        self.fabric.stats.clocks_us = dict(self.fabric.clock_us)
        if self.error is None and self.fabric.failures:
            self.fabric.stats.failed_rank = failing_rank(self.fabric.failures)
            self.error = self.fabric.failures[self.fabric.stats.failed_rank]
        if self.error is None:
            try:
                self.fabric.check_surplus_decisions()
            except CollectiveError as exc:
                self.error = exc
        if self.error is not None:
            raise self.error
        return self.fabric.stats

    def _thread(self, rank: int, body: Callable[[], Any]) -> None:
        self._take_baton(rank)
        try:
            self._run_body(rank, body)
        finally:
            self._give_baton(rank)

    def _run_body(self, rank: int, body: Callable[[], Any]) -> None:
        try:
            result = body()
        except CollectiveError:
            with self._lock:
                self._leave(rank, self._finished)
            return
        except BaseException as exc:  # the rank fails: it never arrives anywhere again
            with self._lock:
                self.fabric.failures[rank] = exc
                self._leave(rank, self._failed)
            return
        with self._lock:
            self.fabric.stats.results[rank] = result
            self._leave(rank, self._finished)

    # -- under the lock ---------------------------------------------------------------
    def _leave(self, rank: int, where: set[int]) -> None:
        self._running.discard(rank)
        where.add(rank)
        self._check_stuck()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _fail_all(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        for rank in list(self._parked):
            self._wake[rank].set()

    def _check_stuck(self) -> None:
        """Every live thread blocked with no meeting able to complete: a deadlock, or a timeout
        naming the failed rank the others wait for."""
        if self._running or not self._parked or self.error is not None:
            return
        try:
            self.fabric._stuck(set(self._parked), set(self._failed), set(self._finished))
        except CollectiveError as exc:
            self._fail_all(exc)
