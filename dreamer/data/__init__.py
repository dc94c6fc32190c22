"""The data path from env workers to the learner's device.

- ``collectors``: spawned TorchRL collector workers stepping envs with the policy;
- ``supervisor``: notices a dead worker and rebuilds the collector;
- ``replay``: uint8 steps in (pinned) host storage, sequences sampled with prefetch;
- ``transforms``: pixel / vector preprocessing on the device that consumes them.
"""
