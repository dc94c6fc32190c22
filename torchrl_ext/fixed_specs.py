"""A Dreamer model env whose keys, specs and done templates are computed once,
when it is built, so a traced update reads them and writes nothing on the env.

``EnvBase`` computes its key lists (``done_keys``, ``reset_keys``, ...) on first
use and keeps them in ``self.__dict__.setdefault("_cache", {})``. Inside
``torch.compile(fullgraph=True)`` that first use is a mutation of the env's
``__dict__``: torch 2.11's dynamo cannot trace ``dict.setdefault`` on it
("Unsupported method call"), and where it can, the graph guards on the cache's
contents, so a trace started with it empty is traced again once it is filled.
:class:`FixedSpecsDreamerEnv` computes every such value when :meth:`fix_specs`
is called (again whenever a spec is set or the env is moved afterwards) and
answers from those values; ``_cache`` stays empty. Its ``reset`` of a start
tensordict (what Dreamer's actor losses do before imagining) reads only them.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.envs import DreamerEnv, EnvBase

# EnvBase's properties that fill EnvBase._cache (torchrl.envs.common._cache_value).
CACHED_PROPERTIES = (
    "action_keys",
    "state_keys",
    "reward_keys",
    "observation_keys",
    "done_keys",
    "reset_keys",
    "done_keys_groups",
    "_observation_keys_step_mdp",
    "_state_keys_step_mdp",
    "_action_keys_step_mdp",
    "_done_keys_step_mdp",
    "_reward_keys_step_mdp",
    "_has_dynamic_specs",
    "_step_mdp",
    "_simple_done",
)


def _fixed_property(name: str) -> property:
    """``name`` from the values fixed at build; upstream's (cached) property before then."""
    upstream = getattr(EnvBase, name)

    def fget(self):
        fixed = self._fixed_specs
        return upstream.fget(self) if fixed is None else fixed[name]

    return property(fget, doc=upstream.__doc__)


class FixedSpecsDreamerEnv(DreamerEnv):
    """A :class:`~torchrl.envs.DreamerEnv` that answers its key lists and done
    templates from values computed by :meth:`fix_specs` (see the module docstring).

    Call :meth:`fix_specs` once the specs are set (after ``set_specs_from_env``
    and any spec assignment); a spec set or a ``to(device)`` later computes them
    again. Before it is called the env behaves as upstream's.
    """

    _fixed_specs: dict | None = None
    # Done key -> its spec's zero: the env's batch and event shape, dtype and device.
    done_templates: dict | None = None

    def fix_specs(self) -> FixedSpecsDreamerEnv:
        self._fixed_specs = None
        self.empty_cache()
        self.__dict__.pop("_state_keys", None)  # upstream's state_keys keeps its own copy there
        fixed = {name: getattr(self, name) for name in CACHED_PROPERTIES}
        self.done_templates = {key: self.full_done_spec[key].zero() for key in fixed["done_keys"]}
        self.empty_cache()  # computing them went through upstream's cache
        self._fixed_specs = fixed
        return self

    def __setattr__(self, key, value):
        super().__setattr__(key, value)
        if self._fixed_specs is not None and key.endswith(("_spec", "_spec_unbatched", "batch_size")):
            self.fix_specs()

    def set_specs_from_env(self, env: EnvBase):
        super().set_specs_from_env(env)
        if self._fixed_specs is not None:
            self.fix_specs()

    def to(self, device) -> FixedSpecsDreamerEnv:
        out = super().to(device)
        if self._fixed_specs is not None:
            self.fix_specs()
        return out

    action_keys = _fixed_property("action_keys")
    state_keys = _fixed_property("state_keys")
    reward_keys = _fixed_property("reward_keys")
    observation_keys = _fixed_property("observation_keys")
    done_keys = _fixed_property("done_keys")
    reset_keys = _fixed_property("reset_keys")
    done_keys_groups = _fixed_property("done_keys_groups")
    _observation_keys_step_mdp = _fixed_property("_observation_keys_step_mdp")
    _state_keys_step_mdp = _fixed_property("_state_keys_step_mdp")
    _action_keys_step_mdp = _fixed_property("_action_keys_step_mdp")
    _done_keys_step_mdp = _fixed_property("_done_keys_step_mdp")
    _reward_keys_step_mdp = _fixed_property("_reward_keys_step_mdp")
    _has_dynamic_specs = _fixed_property("_has_dynamic_specs")
    _step_mdp = _fixed_property("_step_mdp")
    _simple_done = _fixed_property("_simple_done")

    def not_done(self, batch_size: torch.Size) -> dict:
        """Every done key's flags, all False, for a tensordict of ``batch_size``: what
        upstream fills a missing done key with (``EnvBase._complete_done``)."""
        leading = batch_size[: len(batch_size) - len(self.batch_size)]
        return {key: zero.expand(*leading, *zero.shape).clone() for key, zero in self.done_templates.items()}

    def reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        """Upstream's reset of a start tensordict that carries no done or reset key
        (the model env's ``_reset`` copies it, then the done keys are filled with
        False), read from the fixed values; any other call is upstream's."""
        if self._fixed_specs is None or tensordict is None or kwargs or any(
            tensordict.get(key, None) is not None for key in (*self.done_keys, *self.reset_keys)
        ):
            return super().reset(tensordict, **kwargs)
        started = self._reset(tensordict)
        started.update(self.not_done(started.batch_size))
        return tensordict.update(started)
