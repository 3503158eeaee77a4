"""Whether this process is the facade's launcher, ``python -m sim.facade -- CMD`` (stdlib only).

The launcher only starts CMD and passes signals on to it (`sim.facade.__main__`): its own
process needs neither torch nor the simulator, and importing them cost about 1.5 s of CPU in
every launch (most of it ``import torch``). But Python imports the ``sim`` and ``sim.facade``
packages before it runs ``sim/facade/__main__.py``, and importing ``sim`` registers the CPU
kernels (which imports torch). So both packages ask `is_facade_launcher` first and import
nothing heavy while it is true.

It is true only while runpy imports the packages of the module named after ``-m``
(``sys.argv[0]`` is ``"-m"`` until runpy has found that module, CPython's documented ``-m``
behaviour) and that module is ``sim.facade``, as ``sys.orig_argv`` spells it. Every other way
of importing ``sim`` (``import sim``, ``python -m pytest``, ``python -m sim.something_else``,
CMD itself, which is a process of its own) imports it whole.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

__all__ = ["LAUNCHER_MODULES", "is_facade_launcher", "module_after_dash_m"]

LAUNCHER_MODULES = frozenset({"sim.facade", "sim.facade.__main__"})
# Interpreter options whose value is the next argument (python --help: -c cmd, -m mod, -W arg, -X opt).
_OPTIONS_WITH_A_VALUE = frozenset({"-W", "-X"})


def module_after_dash_m(orig_argv: Sequence[str]) -> Optional[str]:
    """The module an interpreter command line runs with ``-m`` (``-m mod`` or ``-mmod``), or None
    (a script, ``-c``, or no ``-m`` before them)."""
    arguments = iter(orig_argv[1:])
    for argument in arguments:
        if argument == "-m":
            return next(arguments, None)
        if argument.startswith("-m"):
            return argument[2:]
        if argument in _OPTIONS_WITH_A_VALUE:
            next(arguments, None)
            continue
        if argument == "-c" or argument == "-" or not argument.startswith("-"):
            return None
    return None


def is_facade_launcher() -> bool:
    """True while ``python -m sim.facade`` imports the packages before running the launcher."""
    return sys.argv[:1] == ["-m"] and module_after_dash_m(getattr(sys, "orig_argv", ())) in LAUNCHER_MODULES
