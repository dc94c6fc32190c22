"""`python -m dreamer [overrides]`: the Hydra entry point."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from dreamer.config import load_config, register_configs
from dreamer.errors import UserError

register_configs()
log = logging.getLogger("dreamer")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(dict_cfg: DictConfig) -> None:
    import torch.multiprocessing as mp
    from hydra.core.hydra_config import HydraConfig

    # Workers must start clean: spawn, never fork (fork would copy any
    # compiler / CUDA state the parent has).
    mp.set_start_method("spawn", force=True)
    try:
        cfg = load_config(dict_cfg, environ=os.environ)
        from dreamer.train import train

        summary = train(cfg, Path(HydraConfig.get().runtime.output_dir))
        log.info("done: %s", {k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()})
    except UserError as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
