"""The command line's overrides composed as Hydra will compose them, before Hydra runs.

Hydra reports an unknown preset, an unknown key or a value of the wrong type with a
multi-line block (exit status 1) before our code runs, and only after it has created
the run directory. Composing the same config here first turns each into one line
(:class:`~dreamer.errors.UserError`), and tells the checks (dreamer.check) which
directory Hydra will write into and, for ``-m``, which jobs the sweep holds.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from dreamer.config.location import conf_dir
from dreamer.errors import UserError


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), err.__class__.__name__)


# Group options renamed so each preset's name says the algorithm it trains and none is also
# a config group's option (env=dmc_proprio): group -> old name -> new name, refused with the new one.
RENAMED_OPTIONS = {
    "experiment": {
        "dmc_cheetah_run": "dmc_cheetah_run_v1",
        "dmc_walker_walk": "dmc_walker_walk_v1",
        "atari_pong": "atari_pong_v1",
        "dmc_vision": "dmc_vision_v3",
        "dmc_proprio": "dmc_proprio_v3",
        "atari100k": "atari100k_v3",
        "pendulum": "small",  # the CPU-sized V3 preset, which runs any task
        "pendulum_v3": "small",
        "gym_state": "gym_state_v3",  # DMC-proprio's published setting: its name says V3
    },
    "compile": {"default": "off"},
}
# Options retired without a successor: group -> old name -> what to do instead.
RETIRED_OPTIONS = {
    "experiment": {"default": "the default run is the schema's defaults: leave experiment= out"},
}


def is_hydra_override(override: str) -> bool:
    """``hydra.run.dir=...``, ``hydra/launcher=...``: Hydra's own settings, not the run's config."""
    return override.lstrip("+~").startswith(("hydra.", "hydra/"))


@contextlib.contextmanager
def _composing() -> Iterator[None]:
    """Hydra's compose API on conf/: inside a running Hydra app (or a test that set one
    up) its own context, else one of our own for the length of the block."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dreamer.config import register_configs

    register_configs()
    if GlobalHydra.instance().is_initialized():
        yield
        return
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        yield


def compose_overrides(overrides: list[str], *, with_hydra: bool = False) -> Any:
    """conf/ composed with ``overrides`` (a DictConfig); Hydra's own settings are left
    out unless ``with_hydra`` (then under ``hydra``, as Hydra resolves them for the run).
    A mistake in the overrides is one line."""
    from hydra import compose
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    mine = overrides if with_hydra else [o for o in overrides if not is_hydra_override(o)]
    try:
        with _composing():
            return compose(config_name="config", overrides=list(mine), return_hydra_config=with_hydra)
    except MissingConfigException as err:
        options = ", ".join(sorted(err.options or []))
        group, _, name = (err.missing_cfg_file or "").partition("/")
        if name in RENAMED_OPTIONS.get(group, {}):
            raise UserError(f"{group}={name} was renamed: use {group}={RENAMED_OPTIONS[group][name]}") from None
        if name in RETIRED_OPTIONS.get(group, {}):
            raise UserError(f"{group}={name} was retired: {RETIRED_OPTIONS[group][name]}") from None
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


def compose_with_settings(overrides: list[str]) -> tuple[Any, Any]:
    """(the run's config, Hydra's own settings: ``run.dir``, ``sweep.dir``, ``launcher``, ...),
    composed once from ``overrides`` and resolved as Hydra resolves them (``${now:...}`` to this second)."""
    from omegaconf import open_dict

    composed = compose_overrides(overrides, with_hydra=True)
    settings = composed.hydra
    with open_dict(composed):
        del composed["hydra"]
    return composed, settings


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The jobs ``-m`` runs: each one's overrides, as Hydra's basic sweeper expands the
    swept values (``seed=0,1,2``, ``range(...)``, ``choice(...)``) into their product."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        batches = BasicSweeper.split_arguments(parsed, None)
    except HydraException as err:
        raise UserError(f"cannot parse the overrides {' '.join(overrides)!r}: {_first_line(err)}") from None
    return [list(job) for batch in batches for job in batch]
