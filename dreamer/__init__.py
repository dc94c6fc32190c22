"""Dreamer on TorchRL: ``python -m dreamer`` (see README.md)."""

from torchrl_ext.tensordict_fast_path import install_from_any_fast_path

# Every process that imports dreamer (learner, collector workers, scripts) gets it.
install_from_any_fast_path()
