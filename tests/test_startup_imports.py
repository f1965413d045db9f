"""What the ``offsim`` process pays for at start and at exit (issue 16: the whole ``offsim run``
process against ``python -c "import numpy, pydantic, simpy, yaml"``; ``benchmarks/bench_process.py``
times it, these tests check the mechanisms, never a timing)."""

from __future__ import annotations

import os
import subprocess
import sys

#: runs after every handler registered later, so it sees the state the interpreter exits with
PROBE_AT_EXIT = ("import atexit, gc\n"
                 "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n")
MAIN_EXAMPLE = "['run', '-H', 'rtx4090-pcie4-ws', '-w', 'llama2-7b', '-s', 'zero-offload', '-q']"


def _stdout(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout


def test_the_console_app_freezes_the_collector_at_exit() -> None:
    """``app()`` (the console script's call) leaves every object frozen when the interpreter exits,
    so shutdown's collections skip them; importing the CLI alone freezes nothing."""
    called = _stdout(PROBE_AT_EXIT + "from offsim.cli import app\n"
                     "for argv in (['version'], ['version']):\n"
                     "    try:\n        app(argv)\n    except SystemExit:\n        pass\n")
    assert called.splitlines()[-1] == "frozen at exit: True"
    assert called.count("offsim ") == 2  # the version, once per call: the commands ran as before
    imported = _stdout(PROBE_AT_EXIT + "import offsim.cli\n")
    assert imported.splitlines() == ["frozen at exit: False"]


def test_the_freeze_is_registered_once_however_often_the_app_runs() -> None:
    """Each call of ``app()`` re-registers the one handler: it runs once at exit, after the others."""
    ran = _stdout("import atexit, gc\n"
                  "runs = []\n"
                  "real_freeze = gc.freeze\n"
                  "gc.freeze = lambda: runs.append('freeze') or real_freeze()\n"
                  "atexit.register(lambda: print(runs))\n"
                  "from offsim.cli import freeze_at_exit\n"
                  "freeze_at_exit()\n"
                  "atexit.register(lambda: runs.append('a handler registered between the calls'))\n"
                  "freeze_at_exit()\n")
    assert ran.splitlines() == ["['a handler registered between the calls', 'freeze']"]


def test_the_main_example_imports_no_heavy_package() -> None:
    """The README's main example, entered as the console script enters it, imports none of pandas,
    plotly, Dask, PyTorch, SciPy, pyarrow or rich (its table is written without rich, as rich
    writes it: tests/test_plain_table.py), and no command module but the shared helpers."""
    loaded = set(_stdout("import sys\nfrom offsim.cli import app\n"
                         f"try:\n    app({MAIN_EXAMPLE})\nexcept SystemExit as exc:\n    assert exc.code == 0\n"
                         "print(' '.join(sys.modules))").split())
    assert not {m.split(".")[0] for m in loaded} & {"pandas", "plotly", "dask", "distributed", "torch",
                                                    "scipy", "pyarrow", "rich"}
    assert {m for m in loaded if m.startswith("offsim.commands.")} <= {"offsim.commands._common",
                                                                       "offsim.commands._options",
                                                                       "offsim.commands._plain_table"}


def test_the_consoles_made_on_first_use_read_the_environment_as_if_made_at_import() -> None:
    """``offsim.commands._common``'s rich consoles, now made on first use, have the width of
    consoles made when the module was imported (as they were before): COLUMNS as it was then
    (50), or, where it was not set, as it is at each print (33)."""
    code = ("import os\nfrom rich.console import Console\nfrom offsim.commands import _common\n"
            "at_import = Console(), Console(stderr=True)\nos.environ['COLUMNS'] = '33'\n"
            "print(_common.console.width, at_import[0].width, _common.err_console.width, at_import[1].width)")
    for columns, width in ((None, 33), ("50", 50)):
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        env |= {} if columns is None else {"COLUMNS": columns}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              timeout=120, env=env)
        assert done.stdout.split() == [str(width)] * 4
