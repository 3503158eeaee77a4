"""Failpoints: the fault-plan grammar of docs/faults.md ("The plan grammar") and the errors each code raises.

Theory of operation. A plan maps a *site* (a place in the simulator that consults the
plan: capture_begin, capture_end, replay, task_update, event_record, malloc, synchronize)
to a sequence of *terms*. Each hit of a site advances that site's hit counter; a term with
a count covers that many hits, then the next term takes over, and the last term applies
for ever. A term with a percentage fires its action on that share of its hits (drawn from
the plan's seeded generator) and otherwise behaves as ``off``.

    plan   := rule (";" rule)*
    rule   := site "=" term ("->" term)*
    term   := [count "*"] [percent "%"] action
    action := "off" | "raise(" code ")" | "delay(" ms ")" | "hang" | "skip_update" | "perturb(" x ")"
    code   := "207008" | "alloc_sq_cq" | "207005" | "oom" | "device_lost"

A plan object carries its hit counters and generator; `FaultPlan.fresh()` gives an
unused copy, which is what a device keeps (two devices never share counters).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

import torch

from ascendgraph.errors import (
    TEXT_207005,
    TEXT_207008_CAPTURE_BEGIN,
    TEXT_ALLOC_SQ_CQ,
    TEXT_DEVICE_LOST,
    TEXT_NPU_OOM,
    TEXT_STREAMS_INSUFFICIENT,
    ConfigError,
    DeviceLost,
)
from ascendgraph.readers import MAX_INT_DIGITS, check_text_size, read_float

__all__ = ["MAX_DELAY_MS", "SITES", "ACTIONS", "CODES", "Action", "Term", "FaultPlan", "fault_error"]

SITES = ("capture_begin", "capture_end", "replay", "task_update", "event_record", "malloc", "synchronize")
ACTIONS = ("off", "raise(code)", "delay(ms)", "hang", "skip_update", "perturb(x)")
CODES = ("207008", "alloc_sq_cq", "207005", "oom", "device_lost")


class Action(str, Enum):
    OFF = "off"
    RAISE = "raise"
    DELAY = "delay"
    HANG = "hang"
    SKIP_UPDATE = "skip_update"
    PERTURB = "perturb"  # replay only: add x to the replayed graph's outputs (a planted divergence)


@dataclass(frozen=True)
class Term:
    """One term of a rule: ``count`` hits (None: for ever), ``percent`` chance (None: always)."""

    action: Action
    count: Optional[int] = None
    percent: Optional[float] = None
    code: Optional[str] = None
    delay_ms: float = 0.0
    value: float = 0.0  # perturb(x)

    @property
    def action_text(self) -> str:
        """The action as written in a plan: ``raise(207008)``, ``delay(5)``, ``hang``."""
        return {Action.RAISE: f"raise({self.code})", Action.DELAY: f"delay({self.delay_ms:g})",
                Action.PERTURB: f"perturb({self.value!r})"}.get(
            self.action, self.action.value
        )

    def __str__(self) -> str:
        text = self.action_text
        if self.percent is not None:
            text = f"{self.percent:g}%{text}"
        if self.count is not None:
            text = f"{self.count}*{text}"
        return text


_TERM = re.compile(
    r"^(?:(?P<count>[^*%]+)\*)?(?:(?P<percent>[^*%]+)%)?(?P<action>[A-Za-z_]+)(?:\((?P<arg>[^()]*)\))?$"
)


_COUNT = re.compile(f"[0-9]{{1,{MAX_INT_DIGITS}}}")
MAX_DELAY_MS = 3_600_000  # one hour: a longer delay is a typo, and `hang` says "never returns"


def _short(text: Optional[str]) -> str:
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _bad(message: str) -> ConfigError:
    return ConfigError(message, key="fault_plan")


def _parse_term(text: str, site: str) -> Term:
    token = text.strip()
    match = _TERM.match(token.replace(" ", ""))
    if not match:
        raise _bad(
            f"fault plan: cannot read term {_short(token)} of site {_short(site)}; a term is "
            f"[count*][percent%]action with action one of {', '.join(ACTIONS)}"
        )
    count = percent = None
    if match.group("count") is not None:
        raw = match.group("count")
        if not _COUNT.fullmatch(raw) or int(raw) < 1:
            raise _bad(f"fault plan: count {_short(raw)} in {_short(token)} must be a positive integer "
                       f"(ASCII digits, at most {MAX_INT_DIGITS})")
        count = int(raw)
    if match.group("percent") is not None:
        raw = match.group("percent")
        try:
            percent = read_float(raw, "")
        except ConfigError:
            raise _bad(f"fault plan: percentage {_short(raw)} in {_short(token)} is not a finite number") from None
        if not 0.0 <= percent <= 100.0:
            raise _bad(f"fault plan: percentage {_short(raw)} in {_short(token)} must be between 0 and 100")
    name, arg = match.group("action"), match.group("arg")
    names = [a.value for a in Action]
    if name not in names:
        raise _bad(
            f"fault plan: unknown action {_short(name)} in {_short(token)}; valid actions: {', '.join(ACTIONS)}"
        )
    action = Action(name)
    takes_arg = action in (Action.RAISE, Action.DELAY, Action.PERTURB)
    if takes_arg and arg is None:
        raise _bad(f"fault plan: action {_short(name)} in {_short(token)} needs an argument: {name}(...)")
    if not takes_arg and arg is not None:
        raise _bad(f"fault plan: action {_short(name)} in {_short(token)} takes no argument")
    if action is Action.SKIP_UPDATE and site != "task_update":
        raise _bad(f"fault plan: skip_update only applies to site 'task_update', not {_short(site)}")
    if action is Action.PERTURB:
        if site != "replay":
            raise _bad(f"fault plan: perturb only applies to site 'replay', not {_short(site)}")
        try:
            value = read_float(arg or "", "")
        except ConfigError:
            raise _bad(f"fault plan: perturb {_short(arg)} in {_short(token)} must be a finite number") from None
        return Term(action, count, percent, value=value)
    if action is Action.RAISE:
        if arg not in CODES:
            raise _bad(f"fault plan: unknown code {_short(arg)} in {_short(token)}; valid codes: {', '.join(CODES)}")
        return Term(action, count, percent, code=arg)
    if action is Action.DELAY:
        try:
            delay = read_float(arg or "", "")
        except ConfigError:
            raise _bad(
                f"fault plan: delay {_short(arg)} in {_short(token)} must be a finite number of milliseconds"
            ) from None
        if not 0 <= delay <= MAX_DELAY_MS:
            raise _bad(f"fault plan: delay {_short(arg)} in {_short(token)} must be >= 0 ms and at most "
                       f"{MAX_DELAY_MS} ms (one hour)")
        return Term(action, count, percent, delay_ms=delay)
    return Term(action, count, percent)


@dataclass
class FaultPlan:
    """A parsed fault plan with its own hit counters and seeded generator."""

    rules: dict[str, tuple[Term, ...]] = field(default_factory=dict)
    seed: int = 0
    spec: str = ""

    def __post_init__(self) -> None:
        self._hits: dict[str, int] = {}
        self._random = random.Random(self.seed)

    @classmethod
    def parse(cls, spec: str, *, seed: int = 0) -> "FaultPlan":
        """Parse a plan string; an empty string is the empty plan. Bad input -> ConfigError."""
        if not isinstance(spec, str):
            raise _bad(f"fault plan must be a string, got {_short(spec)}")
        check_text_size(spec, "fault plan", key="fault_plan")
        rules: dict[str, tuple[Term, ...]] = {}
        for raw_rule in spec.split(";"):
            rule = raw_rule.strip()
            if not rule:
                continue
            site, sep, body = rule.partition("=")
            site = site.strip()
            if not sep:
                raise _bad(f"fault plan: rule {_short(rule)} needs the form site=term(->term)*")
            if site not in SITES:
                raise _bad(f"fault plan: unknown site {_short(site)}; valid sites: {', '.join(SITES)}")
            if site in rules:
                raise _bad(f"fault plan: site {_short(site)} appears twice; give one rule per site")
            terms = tuple(_parse_term(part, site) for part in body.split("->"))
            for term in terms[:-1]:
                if term.count is None:
                    raise _bad(
                        f"fault plan: in {_short(rule)}, term {str(term)!r} has no count but is not the "
                        "last term, so the terms after it could never apply"
                    )
            rules[site] = terms
        return cls(rules=rules, seed=seed, spec=spec)

    def fresh(self, seed: Optional[int] = None) -> "FaultPlan":
        """An unused copy (counters at zero), optionally with another seed."""
        return FaultPlan(rules=dict(self.rules), seed=self.seed if seed is None else seed, spec=self.spec)

    def hits(self, site: str) -> int:
        return self._hits.get(site, 0)

    def consult(self, site: str) -> Optional[Term]:
        """Count a hit of ``site``; return the term that fires, or None (nothing happens)."""
        terms = self.rules.get(site)
        if not terms:
            return None
        hit = self._hits.get(site, 0)
        self._hits[site] = hit + 1
        covered = 0
        term = terms[-1]
        for candidate in terms:
            if candidate.count is None or hit < covered + candidate.count:
                term = candidate
                break
            covered += candidate.count
        if term.percent is not None and self._random.random() * 100.0 >= term.percent:
            return None
        return None if term.action is Action.OFF else term

    def __str__(self) -> str:
        return "; ".join(f"{site}=" + "->".join(str(t) for t in terms) for site, terms in self.rules.items())


def fault_error(code: str, *, site: str, stream_id: int = 0, size_bytes: int = 0) -> BaseException:
    """The exception a real stack raises for ``code`` (texts from ascendgraph.errors)."""
    if code == "207008":
        return RuntimeError(TEXT_207008_CAPTURE_BEGIN + "\n" + TEXT_STREAMS_INSUFFICIENT)
    if code == "alloc_sq_cq":
        return RuntimeError(TEXT_ALLOC_SQ_CQ.format(stream_id=stream_id))
    if code == "207005":
        return RuntimeError(TEXT_207005)
    if code == "oom":
        size = f"{size_bytes / 2**20:.2f} MiB" if size_bytes else "memory"
        return torch.OutOfMemoryError(TEXT_NPU_OOM.format(size=size))
    if code == "device_lost":
        return DeviceLost(TEXT_DEVICE_LOST.format(site=site))
    raise _bad(f"fault plan: unknown code {code!r}; valid codes: {', '.join(CODES)}")
