"""dreamer/report/console.py: a run prints our lines; --verbose keeps the libraries' too."""

from __future__ import annotations

import logging
import warnings

from dreamer.report.console import VERBOSE_ENV, quiet_libraries, verbose_requested


def test_library_warnings_and_info_lines_are_filtered():
    root, ours = logging.getLogger().level, logging.getLogger("dreamer").level
    try:
        _filtered()
    finally:  # the pytest process's logging as it was
        logging.getLogger().setLevel(root)
        logging.getLogger("dreamer").setLevel(ours)


def _filtered():
    environ = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_libraries(environ)
        warnings.warn_explicit("inline_inbuilt_nn_modules is deprecated", FutureWarning, "utils.py", 1,
                               module="tensordict.utils")
        warnings.warn_explicit("Dynamo does not know how to trace", UserWarning, "functions.py", 1,
                               module="torch._dynamo.variables.functions")
        warnings.warn_explicit("ours", UserWarning, "trainer.py", 1, module="dreamer.run.trainer")
    assert [str(w.message) for w in caught] == ["ours"]
    assert logging.getLogger("torchrl").getEffectiveLevel() >= logging.WARNING
    # Any other library's logger, also one created later (PyOpenGL's INFO line), reports warnings only.
    assert not logging.getLogger("OpenGL.acceleratesupport").isEnabledFor(logging.INFO)
    assert logging.getLogger("dreamer.run").isEnabledFor(logging.INFO)
    # Spawned workers inherit the filters before they import the libraries.
    assert "FutureWarning" in environ["PYTHONWARNINGS"] and environ["RL_LOGGING_LEVEL"] == "WARNING"


def test_verbose_is_our_flag_and_hydra_full_error_implies_it():
    argv = ["python", "--verbose", "experiment=smoke"]
    assert verbose_requested(argv, {}) and argv == ["python", "experiment=smoke"]  # Hydra never sees it
    assert verbose_requested(["python"], {"HYDRA_FULL_ERROR": "1"})
    assert verbose_requested(["python"], {VERBOSE_ENV: "1"})
    assert not verbose_requested(["python", "experiment=smoke"], {})
