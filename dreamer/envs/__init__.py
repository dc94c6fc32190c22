"""Environments with one contract whatever the backend (gymnasium, dm_control, Atari).

- ``factory``: ``make_env`` / ``env_factory`` (observation keys, the policy's carry, episode limit);
- ``action_repeat``: repeat wrappers below the renderer (one frame drawn per agent step);
- ``rendering``: ``MUJOCO_GL`` chosen by rendering (glfw, egl, osmesa).
"""
