"""Dreamer algorithms on one learner skeleton.

To add an algorithm: create ``dreamer/algos/<name>/`` with ``models.py``
(``build_models(algo_cfg, env_cfg, env, device)``, returning a model set that
mixes in :class:`dreamer.algos.policy.ActingPolicy`) and ``learner.py`` (a
:class:`dreamer.algos.learner.BaseLearner` subclass supplying its losses,
optimisers, non-finite policy and phase hooks), add one line to ``ALGORITHMS``
in ``dreamer/algos/registry.py``, and add its config class in
``dreamer/config``. Nothing else changes: the trainer, scripts and tests look
algorithms up by ``algo.name`` in the registry.
"""
