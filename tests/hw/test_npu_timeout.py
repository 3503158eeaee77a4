"""npu items get pytest-timeout's *thread* method: a test blocked inside C (an ACL call
waiting on a card that never answers) is ended at the limit. The signal method cannot do
it: its SIGALRM handler is Python code, which runs only when the blocked C call returns.

The blocker below is C-level for real: the main thread waits in libc's ``pthread_join``
(ctypes releases the GIL; POSIX says pthread_join never returns EINTR) on a thread that
sleeps for an hour. Under the signal method the inner run never ends (the outer
subprocess timeout fires); under the thread method it is ended after the limit."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from ascendgraph.testing import plugin as ag_plugin
from hw import api

from tests.inner_pytest import UNUSED_PLUGINS_OFF

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(api.load_torch_npu()[0] is not None, reason="torch_npu is importable here")

BLOCKED_IN_C = '''
import ctypes
import time

import pytest

pytestmark = pytest.mark.npu


def test_blocked_in_c():
    libc = ctypes.CDLL(None)
    body = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda _: time.sleep(3600))
    thread = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(thread), None, body, None) == 0
    libc.pthread_join(thread, None)  # never returns, and a signal does not interrupt it
'''
SUITE = {
    "pytest.ini": "[pytest]\nmarkers =\n    npu: needs an NPU\n",
    # The plugin's limit, shortened for this suite (read when npu items are collected).
    "conftest.py": "import ascendgraph.testing.plugin as plugin\n\nplugin.NPU_TIMEOUT_S = 2.0\n",
    "test_blocked.py": BLOCKED_IN_C,
}


def test_npu_items_get_the_thread_method() -> None:
    item_markers: list[pytest.Mark] = []

    class Item:
        def get_closest_marker(self, name: str) -> None:
            return None

        def add_marker(self, marker: pytest.MarkDecorator) -> None:
            item_markers.append(marker.mark)

    class Config:
        class pluginmanager:
            @staticmethod
            def hasplugin(name: str) -> bool:
                return name == "timeout"

        @staticmethod
        def getoption(name: str, default: object = None) -> object:
            return default

    ag_plugin._add_timeouts(Config(), [Item()])  # type: ignore[arg-type]
    assert [(m.args, m.kwargs) for m in item_markers] == [((ag_plugin.NPU_TIMEOUT_S,), {"method": "thread"})]


@pytest.mark.skipif(sys.platform != "linux", reason="the C-level blocker uses glibc's pthread_join")
def test_a_test_blocked_in_c_is_ended_at_the_limit(tmp_path: Path) -> None:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    registered = {ep.value for ep in entry_points(group="pytest11")}
    plugins = [arg for name in ("ascendgraph.testing.plugin", "ascendgraph_npu_facade")
               if name not in registered for arg in ("-p", name)]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *UNUSED_PLUGINS_OFF, *plugins,
               "-m", "npu", "--npu-facade"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the npu test blocked in C was not ended by pytest-timeout at its 2 s limit: {hung}")
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "Timeout" in output, output
    assert "test_blocked_in_c" in output, output
