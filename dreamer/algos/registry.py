"""algo.name -> the algorithm's model builder and learner class.

Adding an algorithm is one line here (plus ``algos/<name>/`` and its config class).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from dreamer.algos.learner import BaseLearner
from dreamer.algos.v1 import learner as v1_learner
from dreamer.algos.v1 import models as v1_models
from dreamer.algos.v3 import learner as v3_learner
from dreamer.algos.v3 import models as v3_models
from dreamer.errors import UserError


class Algorithm(NamedTuple):
    # (algo_cfg, env_cfg, env, device) -> the model set (with policy(explore))
    build_models: Callable
    # (algo_cfg, compile_cfg, models, device, *, batch_size, batch_length, autocast_dtype=None)
    learner_cls: type[BaseLearner]


ALGORITHMS: dict[str, Algorithm] = {
    "dreamer_v1": Algorithm(v1_models.build_models, v1_learner.DreamerV1Learner),
    "dreamer_v3": Algorithm(v3_models.build_models, v3_learner.DreamerV3Learner),
}


def algorithm(name: str) -> Algorithm:
    """The algorithm ``algo.name`` names."""
    if name not in ALGORITHMS:
        raise UserError(f"algo.name={name} is not an algorithm; choose one of: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
