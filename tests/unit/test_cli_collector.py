"""The console script and Python's cyclic garbage collector (ascendgraph/cli/app.py
`_import_torch_whole`, ascendgraph/cli/__init__.py `main`): a process that imports torch for a
command freezes what the import made, and the console script freezes everything once the
command returned (CPython's shutdown collection then walks nothing). A process that calls
`main(argv)` itself (a test, a notebook) keeps its collector as it was."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from ascendgraph.cli import MIDDLE_GENERATION_THRESHOLD, YOUNG_GENERATION_THRESHOLD, app, main

# The count of objects importing torch leaves (about 110,000 with torch 2.13): any real import
# of torch is far above this floor, a forgotten freeze stays at 0.
FROZEN_BY_THE_TORCH_IMPORT = 50_000


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_command_that_imports_torch_freezes_what_the_import_made():
    out = _python("""
        import gc, sys
        from ascendgraph.cli import app
        assert "torch" not in sys.modules
        app.import_torch_whole()
        print(gc.get_freeze_count())
    """)
    assert int(out) > FROZEN_BY_THE_TORCH_IMPORT


def test_a_process_that_had_torch_already_keeps_its_collector():
    import torch  # noqa: F401  (as in any test process calling main)

    before = gc.get_freeze_count()
    app.import_torch_whole()
    assert gc.get_freeze_count() == before


def test_the_console_script_freezes_every_object_once_the_command_returned():
    out = _python("""
        import gc, sys
        from ascendgraph.cli import main
        sys.argv = ["ascendgraph", "explain", "--json"]
        code = main()
        print(code, gc.get_freeze_count(), *gc.get_threshold()[:2])
    """)
    code, frozen, young, middle = out.splitlines()[-1].split()
    assert code == "0" and int(frozen) > 0
    assert int(young) == YOUNG_GENERATION_THRESHOLD != 700  # CPython's default
    assert int(middle) == MIDDLE_GENERATION_THRESHOLD != 10  # CPython's default


def test_main_called_with_arguments_leaves_the_collector_alone(capsys):
    before, thresholds = gc.get_freeze_count(), gc.get_threshold()
    gc.set_threshold(1234, *thresholds[1:])
    try:
        assert main(["explain", "--json"]) == 0
        assert gc.get_threshold()[0] == 1234
    finally:
        gc.set_threshold(*thresholds)
    capsys.readouterr()
    # Nothing was frozen. The count may drop: a frozen object that dies leaves the permanent
    # generation (another test of this worker may have frozen some before).
    assert gc.get_freeze_count() <= before


CLI_RUN_ARGS = ["run", "--num-layers", "1", "--max-num-seqs", "4", "--max-num-batched-tokens", "16",
                "--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 4]}', "--requests", "2", "--quiet", "--json"]
_CLI_RUN = f"""
    import json, sys
    from ascendgraph.cli import app
    code = app.main({CLI_RUN_ARGS!r})
    print(json.dumps({{"code": code, "dynamo": "torch._dynamo" in sys.modules}}))
"""


def test_a_warm_cli_run_with_the_collector_frozen_still_never_imports_dynamo(tmp_path, monkeypatch, capsys):
    """The freeze hides torch's objects from gc.get_objects(): the deferral of torch's Dynamo
    guards (ascendgraph.dynamo_gate) must have seen them first. The cold run that stores the
    traced entry runs here (as in tests/unit/test_dynamo_gate.py): only the warm run needs a
    fresh process of its own."""
    import json

    from ascendgraph.compile.cache import CACHE_SUBDIR, TRACED_SUBDIR

    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    traced = tmp_path / CACHE_SUBDIR / TRACED_SUBDIR
    assert app.main(CLI_RUN_ARGS) == 0
    capsys.readouterr()
    assert list(traced.glob("*.pkl"))  # it traced and stored the entry
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_CLI_RUN)], capture_output=True, text=True,
                          timeout=600)  # the test's environment: the cache the run above filled
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"code": 0, "dynamo": False}


def test_a_test_process_collects_young_garbage_less_often_and_froze_what_collection_made():
    """The root conftest's collector settings (YOUNG_GENERATION_THRESHOLD): this test runs under them."""
    assert gc.get_threshold()[0] == 10_000
    assert gc.get_freeze_count() > 0  # the imported modules and the collected items


def test_a_run_that_compiles_with_dynamo_collects_no_older_generation():
    """ascendgraph/compile/backend.py CompiledModel: Dynamo's own collection after the compile
    (``run_gc_after_compile``: the young and middle generations) is off during the run's compile
    and on again afterwards. The caller's middle generation here is larger than a run's, so
    only such an explicit collection would show (ascendgraph/caller_state.py keeps it)."""
    import torch

    from ascendgraph.api import run

    generations: list[int] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            generations.append(info["generation"])

    run_args = {"num_layers": 1, "max_num_seqs": 4, "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}}
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    thresholds = gc.get_threshold()
    gc.set_threshold(10_000, 100_000, thresholds[2])
    gc.callbacks.append(seen)
    try:
        assert run(run_args, requests=2).exit_code == 0
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*thresholds)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs_before  # Dynamo compiled (an empty cache)
    assert generations and set(generations) == {0}
    assert torch._dynamo.config.run_gc_after_compile is True
