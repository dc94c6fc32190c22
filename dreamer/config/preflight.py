"""Command-line checks that run before Hydra, so its errors become one clear line too.

Hydra reports an unknown preset, an unknown key or a value of the wrong type
with a multi-line block (and exit status 1) before our code runs. Composing the
same config here first turns each into ``error: ...`` (exit status 2), and the
config is validated here too (values, a resume directory that
cannot be written) with an output directory that cannot be written: found before
Hydra creates the run directory, so a mistake leaves nothing behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from dreamer.config.load import load_config
from dreamer.config.location import conf_dir
from dreamer.errors import UserError

CONF_DIR = conf_dir()


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), err.__class__.__name__)


# Presets renamed so each name says the algorithm it trains and none is also a config
# group's option (env=dmc_proprio): old name -> new name, refused with the new one.
RENAMED_PRESETS = {
    "dmc_cheetah_run": "dmc_cheetah_run_v1",
    "dmc_walker_walk": "dmc_walker_walk_v1",
    "atari_pong": "atari_pong_v1",
    "dmc_vision": "dmc_vision_v3",
    "dmc_proprio": "dmc_proprio_v3",
    "atari100k": "atari100k_v3",
}


def check_composition(overrides: list[str]) -> Any:
    """Compose conf/ with the user's overrides (Hydra's own settings left out); returns the composed config."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    from dreamer.config import register_configs

    register_configs()
    mine = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=mine)
    except MissingConfigException as err:
        options = ", ".join(sorted(err.options or []))
        group, _, name = (err.missing_cfg_file or "").partition("/")
        if group == "experiment" and name in RENAMED_PRESETS:
            raise UserError(f"experiment={name} was renamed: use experiment={RENAMED_PRESETS[name]}") from None
        raise UserError(
            f"{_first_line(err)}" + (f"; choose {group}= one of: {options}" if options else "")
        ) from None
    except OverrideParseException as err:
        raise UserError(f"cannot parse the overrides {' '.join(mine)!r}: {_first_line(err)}") from None
    except (HydraException, OmegaConfBaseException) as err:
        cause = f": {_first_line(err.__cause__)}" if err.__cause__ is not None else ""
        raise UserError(f"{_first_line(err).rstrip('.')}{cause}") from None
    except ValueError as err:  # Hydra's own for GROUP=null ("... Got NoneType")
        groups = [o.partition("=")[0] for o in mine if o.endswith("=null") and "." not in o.partition("=")[0]]
        hint = f"; to leave {groups[0]} unset write ~{groups[0]}, not {groups[0]}=null" if groups else ""
        raise UserError(f"cannot compose the overrides {' '.join(mine)!r}: {_first_line(err)}{hint}") from None


def check_run_dir_writable(overrides: list[str]) -> None:
    """``hydra.run.dir=DIR`` must be a directory this process can create and write."""
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") != "hydra.run.dir" or not value or "${" in value:
            continue
        run_dir = Path(value)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=run_dir):
                pass
        except OSError as err:
            raise UserError(
                f"hydra.run.dir={value} cannot be written ({err.strerror or err}); choose a writable directory"
            ) from None


def check_run_dirs_not_in_use(overrides: list[str]) -> None:
    """``hydra.run.dir=DIR`` or ``resume=DIR`` locked by a live run (dreamer.run.lock) is
    refused here, before Hydra writes its own files (.hydra/, the job log) into DIR."""
    from dreamer.run.lock import refuse_if_held

    for override in overrides:
        key, _, value = override.partition("=")
        key = key.lstrip("+")
        if key in ("hydra.run.dir", "resume") and value and "${" not in value:
            refuse_if_held(Path(value), key)


def check_resume_dir_writable(resume: str | None) -> None:
    """``resume=DIR``: the run continues writing into DIR (checkpoints, records), so it must be writable."""
    if not resume or not Path(resume).is_dir():
        return  # a missing directory is reported when the run opens it
    try:
        with tempfile.TemporaryFile(dir=resume):
            pass
    except OSError as err:
        raise UserError(
            f"resume={resume} cannot be written ({err.strerror or err}): a resumed run writes its checkpoints "
            "and records there; make it writable (or copy the run directory somewhere writable and resume that)"
        ) from None


def check_command_line(argv: list[str], environ: Mapping[str, str] = os.environ) -> None:
    """All checks, for a plain run (``--help``, ``--cfg``, ``-m`` and the like go straight to Hydra):
    the config is composed and validated here, before Hydra creates the run directory, so a
    mistake leaves nothing behind."""
    if any(arg.startswith("-") for arg in argv):
        return
    cfg = load_config(check_composition(argv), environ=environ)
    if cfg.resume:  # the saved config is checked when the run opens it
        check_resume_dir_writable(cfg.resume)
    check_run_dirs_not_in_use(argv)
    check_run_dir_writable(argv)
