"""What a run prints: our lines, not the libraries' chatter.

Libraries warn about things a user of ``python -m dreamer`` cannot act on
(tensordict's and torch's deprecation notices, dynamo's tracing hints,
dm_control's absl warnings, torchrl's INFO lines). A normal run filters them,
in the main process and in every collector worker (they re-import the
libraries); ``--verbose`` or ``HYDRA_FULL_ERROR=1`` keeps everything.
"""

from __future__ import annotations

import logging
import warnings
from typing import MutableMapping

# Libraries whose warnings and INFO lines are not for a user of this app.
LIBRARIES = ("torch", "torchrl", "tensordict", "gymnasium", "dm_control", "absl", "mujoco",
             "hydra_plugins.hydra_submitit_launcher")
_MODULES = r"(" + "|".join(name.replace(".", r"\.") for name in LIBRARIES) + r")(\..*)?$"
# Set by the entry point for --verbose (read once, in main()).
VERBOSE_ENV = "DREAMER_VERBOSE"
# Inherited by spawned workers before they import anything.
_PYTHONWARNINGS = "ignore::DeprecationWarning,ignore::FutureWarning"


def verbose_requested(argv: list[str], environ: MutableMapping[str, str]) -> bool:
    """``--verbose`` on the command line (removed from ``argv``: Hydra does not know it),
    ``HYDRA_FULL_ERROR=1``, or an entry point above us that already decided so."""
    verbose = "--verbose" in argv
    while "--verbose" in argv:
        argv.remove("--verbose")
    return verbose or environ.get("HYDRA_FULL_ERROR") == "1" or environ.get(VERBOSE_ENV) == "1"


def quiet_libraries(environ: MutableMapping[str, str] | None = None) -> None:
    """Filter library warnings and INFO lines in this process (and, through
    ``PYTHONWARNINGS`` in ``environ``, in the processes it spawns)."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", module=_MODULES)
    quiet_logging()
    if environ is not None:
        environ.setdefault("PYTHONWARNINGS", _PYTHONWARNINGS)
        # torchrl sets its logger's level from this when it is imported (later, and in workers).
        environ.setdefault("RL_LOGGING_LEVEL", "WARNING")


def quiet_logging() -> None:
    """INFO lines are ours (and Hydra's, for multiruns); every other logger, named or
    not yet created (PyOpenGL's, matplotlib's, ...), reports warnings and errors only.
    Hydra configures logging when the job starts: call again after that."""
    logging.getLogger().setLevel(logging.WARNING)
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING if name != "absl" else logging.ERROR)
    for ours in ("dreamer", "hydra"):
        logging.getLogger(ours).setLevel(logging.INFO)


def quiet_worker() -> None:
    """Collector worker start-up: the same filters, in the worker's own interpreter."""
    quiet_libraries()
