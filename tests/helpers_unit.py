"""Shared helpers for the unit tests (tiny configs, collector-like batches, spies)."""

from __future__ import annotations

import contextlib
import ctypes.util
import dataclasses
import json
import os
import threading
import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from dreamer.config import AlgoConfig, Config, DreamerV3Config, validate

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"

# Headless rendering for gymnasium (pygame) and dm_control (MuJoCo).
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("MUJOCO_GL", "osmesa")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])

# The shared library each headless MuJoCo backend loads (what PyOpenGL asks ctypes for).
GL_LIBRARIES = {"osmesa": ("OSMesa", "apt-get install -y libosmesa6"), "egl": ("EGL", "apt-get install -y libegl1")}


def missing_gl_library(environ=os.environ, find_library=ctypes.util.find_library) -> str | None:
    """One line saying what to install when ``MUJOCO_GL`` names a backend whose
    library is absent (dm_control would fail deep inside PyOpenGL with
    ``'NoneType' object has no attribute 'glGetError'``); None when it is there."""
    backend = environ.get("MUJOCO_GL", "")
    if backend not in GL_LIBRARIES:
        return None
    library, install = GL_LIBRARIES[backend]
    if find_library(library) is not None:
        return None
    return (f"MUJOCO_GL={backend} but lib{library} is not installed: {install} "
            f"(or set MUJOCO_GL to a backend that renders here)")


def tiny_config(*, pixels: bool = False, algo: str = "dreamer_v1", **env_overrides) -> Config:
    """A validated Config small enough for a CPU unit test (no torch.compile).

    ``algo="dreamer_v3"``: V3 with V1's learning rates, adam_eps and gamma, the
    values its tests have always run with (the algo classes were one class then).
    """
    cfg = Config()
    if algo == "dreamer_v3":
        shared = {f.name: getattr(cfg.algo, f.name) for f in dataclasses.fields(AlgoConfig) if f.name != "name"}
        cfg.algo = DreamerV3Config(**shared)
    cfg.env.from_pixels = pixels
    cfg.env.max_episode_steps = 50
    for key, value in env_overrides.items():
        setattr(cfg.env, key, value)
    a = cfg.algo
    if algo == "dreamer_v1":
        a.state_dim = 4
    a.rssm_hidden_dim, a.hidden_dim, a.encoder_channels = 8, 16, 4
    a.imagination_horizon = 3
    b = cfg.buffer
    b.capacity, b.batch_size, b.batch_length, b.prefetch = 200, 2, 5, 0
    cfg.compile.enabled = False
    cfg.collector.num_workers = 0
    return validate(cfg)


# A user's own gymnasium env, as a module that registers it (for env.import).
# Each construction appends its process id to $CUSTOM_ENV_BUILT_BY, if set, so
# a test can see which processes built one.
CUSTOM_ENV_MODULE = """
import os

import gymnasium
import numpy as np


class DriftEnv(gymnasium.Env):
    \"\"\"A point on a line: the action pushes it, reward is minus its distance to 0.\"\"\"

    observation_space = gymnasium.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self):
        if os.environ.get("CUSTOM_ENV_BUILT_BY"):
            with open(os.environ["CUSTOM_ENV_BUILT_BY"], "a") as f:
                f.write(f"{os.getpid()}\\n")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-1.0, 1.0))
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        self.x = float(np.clip(self.x + 0.1 * float(action[0]), -10.0, 10.0))
        return np.array([self.x, 1.0], np.float32), -abs(self.x), False, False, {}


gymnasium.register(id="{env_id}", entry_point=__name__ + ":DriftEnv", max_episode_steps=60)
"""


def write_custom_env_module(directory: Path, module: str, env_id: str) -> Path:
    """``directory/module.py`` registering ``env_id`` with gymnasium when imported."""
    path = Path(directory) / f"{module}.py"
    path.write_text(CUSTOM_ENV_MODULE.replace("{env_id}", env_id))
    return path


def collector_batch(
    *,
    traj_id: int,
    first_step: int,
    steps: int,
    frame: int = 64,
    action_dim: int = 1,
    seed: int | None = None,
) -> TensorDict:
    """What a TorchRL collector hands over for one worker: a (steps,) batch with
    root and ("next") pixels, policy outputs (extra keys) and trajectory ids."""
    g = torch.Generator().manual_seed(seed if seed is not None else traj_id * 100_003 + first_step)
    pixels = torch.randint(0, 256, (steps + 1, frame, frame, 3), dtype=torch.uint8, generator=g)
    step_count = torch.arange(first_step, first_step + steps).unsqueeze(-1)
    false = torch.zeros(steps, 1, dtype=torch.bool)
    return TensorDict(
        {
            "pixels": pixels[:-1],
            "action": torch.rand(steps, action_dim, generator=g) * 4 - 2,
            "loc": torch.randn(steps, action_dim, generator=g),
            "scale": torch.rand(steps, action_dim, generator=g),
            "state": torch.randn(steps, 4, generator=g),
            "belief": torch.randn(steps, 8, generator=g),
            "step_count": step_count,
            "collector": {"traj_ids": torch.full((steps,), traj_id, dtype=torch.int64)},
            "next": {
                "pixels": pixels[1:],
                "reward": torch.randn(steps, 1, generator=g),
                "done": false.clone(),
                "terminated": false.clone(),
                "truncated": false.clone(),
                "step_count": step_count + 1,
                "belief": torch.randn(steps, 8, generator=g),
            },
        },
        batch_size=[steps],
    )


# Tensor methods that copy a value to the host: on CUDA each one is a device sync.
HOST_TRANSFERS = ("item", "cpu", "tolist", "__float__", "__int__", "__bool__", "numpy")


def aot_cache_bypasses() -> int:
    """How many compiled graphs AOTAutograd's cache bypassed since ``counters.clear()``.

    torch's counter names are internals: a renamed counter would read 0 and pass a
    ``== 0`` check silently. So the cache must have recorded some outcome under the
    names read here, or the test says which names to update.
    """
    from torch._dynamo.utils import counters

    aot = counters["aot_autograd"]
    outcomes = {name for name in aot if name.startswith("autograd_cache_")}
    assert outcomes, (f"torch {torch.__version__} recorded no AOTAutograd cache outcome as autograd_cache_* "
                      f"(counters: {dict(aot)}): the counter names changed, update this helper")
    return aot["autograd_cache_bypass"]


class CallCounter:
    """Counts calls of patched methods and remembers where they came from."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.sites: Counter = Counter()

    def total(self, *names: str) -> int:
        if not names:
            return sum(self.counts.values())
        return sum(self.counts[n] for n in names)

    def record(self, name: str) -> None:
        self.counts[name] += 1
        frame = traceback.extract_stack(limit=4)[-3]
        where = frame.filename.split("site-packages/")[-1]
        self.sites[f"{name} at {where}:{frame.lineno} ({frame.name})"] += 1

    def report(self) -> str:
        return "; ".join(f"{site} x{n}" for site, n in self.sites.most_common())


def spy_tensor_methods(monkeypatch, names, counter: CallCounter, ignore=lambda t: False):
    """Wrap ``torch.Tensor.<name>`` for each name with a counting wrapper.

    ``ignore(tensor)`` -> True skips counting for that tensor (the call still runs).
    """
    for name in names:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, __name=name, __original=original, **kwargs):
            if not ignore(self):
                counter.record(__name)
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)


class FakeStream:
    def __init__(self, cuda: FakeCuda, name: str):
        self.cuda, self.name = cuda, name

    def wait_event(self, event: FakeEvent) -> None:
        self.cuda.log.append(("wait_event", self.name, event))

    def __repr__(self):
        return f"<stream {self.name}>"


class FakeEvent:
    def __init__(self, cuda: FakeCuda):
        self.cuda, self.stream, self.synchronized, self.done = cuda, None, False, False
        self.after_copy_of: set[int] = set()  # host addresses the copy before it reads

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = stream or self.cuda.current_stream()
        self.after_copy_of = self.cuda.last_copy_reads
        self.cuda.recorded.append(self)
        self.cuda.log.append(("record", self.stream.name, self))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:  # the host waits for the work before the event
        self.synchronized = self.done = True
        self.cuda.log.append(("synchronize", self))


class FakeCuda:
    """torch.cuda's streams, events, host-memory registration and host-to-device
    copies, stood in for on a CPU-only machine, logging what was asked in which
    order. A TensorDict's ``.to(cuda)`` returns a CPU clone (logged with the stream
    current at the call and its non_blocking flag)."""

    def __init__(self, monkeypatch):
        from torchrl_ext import host_memory

        self.log: list[tuple] = []
        self.registered: dict[int, int] = {}  # address -> bytes page-locked now
        self.unregistered: list[int] = []
        self.last_copy_reads: set[int] = set()
        self.recorded: list[FakeEvent] = []  # every event recorded, oldest first
        self.default_stream = FakeStream(self, "default")
        self._current = threading.local()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, **kw: FakeStream(self, "side"))
        monkeypatch.setattr(torch.cuda, "stream", self._use_stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current_stream())
        monkeypatch.setattr(torch.cuda, "Event", lambda **kw: FakeEvent(self))
        monkeypatch.setattr(torch.Tensor, "record_stream",
                            lambda t, stream: self.log.append(("record_stream", stream.name, t.data_ptr())))
        monkeypatch.setattr(host_memory, "register_host_memory", self._register)
        monkeypatch.setattr(host_memory, "unregister_host_memory", self._unregister)
        original_to = TensorDict.to

        def to(td, *args, **kwargs):
            device = args[0] if args else kwargs.get("device")
            if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
                self.last_copy_reads = {t.data_ptr() for t in td.values(True, True)}
                self.log.append(("copy", self.current_stream().name, kwargs.get("non_blocking", False)))
                return td.clone()
            return original_to(td, *args, **kwargs)

        monkeypatch.setattr(TensorDict, "to", to)

    def current_stream(self) -> FakeStream:
        return getattr(self._current, "stream", self.default_stream)

    @contextlib.contextmanager
    def _use_stream(self, stream: FakeStream):
        before = self.current_stream()
        self._current.stream = stream
        try:
            yield
        finally:
            self._current.stream = before

    def _register(self, address: int, nbytes: int) -> None:
        self.registered[address] = nbytes

    def _unregister(self, address: int) -> None:
        del self.registered[address]
        self.unregistered.append(address)

    def page_locked(self, tensor: torch.Tensor) -> bool:
        """Whether all of ``tensor`` lies in memory registered now."""
        start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
        return any(a <= start and end <= a + n for a, n in self.registered.items())

    def last_copy_out_of(self, tensor: torch.Tensor) -> FakeEvent | None:
        """The event recorded after the latest copy that read ``tensor``'s memory."""
        return next((e for e in reversed(self.recorded) if tensor.data_ptr() in e.after_copy_of), None)

    def events(self, what: str) -> list[tuple]:
        return [entry for entry in self.log if entry[0] == what]


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """One intra-op thread: tiny models on a busy 2-core box are many times
    faster without OpenMP threads spinning against each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


from dreamer.envs.factory import close_env  # noqa: E402,F401  (re-exported for the tests)


def old_layout_config(new: dict, channels_last: bool) -> dict:
    """``new`` as the merged AlgoConfig wrote it: channels_last at the top, and
    every key of both algorithms in algo (the other algorithm's at their defaults)."""
    old = json.loads(json.dumps(new))
    v1_only = {"state_dim": 30, "activation": "elu", "grad_clip": 100.0, "kl_scale": 1.0,
               "free_nats": 3.0, "exploration_noise": 0.3}
    v3_only = {"num_categoricals": 32, "num_classes": 32, "unimix": 0.01, "free_bits": 1.0,
               "dyn_loss_scale": 0.5, "rep_loss_scale": 0.1, "num_bins": 255, "gru_blocks": 8,
               "mlp_layers": 2, "entropy_scale": 3.0e-4, "return_norm_rate": 0.01,
               "return_norm_min_scale": 1.0, "slow_critic_tau": 0.02, "slow_critic_reg": 1.0,
               "agc": 0.3, "lr_warmup_steps": 1000, "actor_grad": "auto", "replay_value_scale": 0.3}
    old["algo"].pop("channels_last", None)
    old["algo"] = {**v1_only, **v3_only, **old["algo"]}
    old["channels_last"] = channels_last
    return old


def load_script(name: str):
    """scripts/<name>.py imported as a module (its functions under test)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"script_{name}", REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def learner_on(cfg: Config, device: torch.device, autocast_dtype: torch.dtype | None = None):
    """(learner on ``device``, one batch of stored steps on ``device``): the acting
    policy is built and rolled out on the CPU (as collectors do), the learner's
    networks on ``device``, both from seed 0."""
    from dreamer.algos.registry import algorithm
    from dreamer.data.replay import stored_keys
    from dreamer.envs.factory import make_env

    build, learner_cls = algorithm(cfg.algo.name)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        torch.manual_seed(0)
        acting = build(cfg.algo, cfg.env, env, torch.device("cpu"))
        with torch.no_grad():
            rollout = env.rollout(cfg.buffer.batch_size * cfg.buffer.batch_length, acting.policy(explore=True),
                                  break_when_any_done=False)
        models = build(cfg.algo, cfg.env, env, device)
    finally:
        close_env(env)
    batch = rollout.select(*stored_keys(models.obs_key), strict=False).to(device)
    learner = learner_cls(cfg.algo, cfg.compile, models, device, batch_size=cfg.buffer.batch_size,
                          batch_length=cfg.buffer.batch_length, autocast_dtype=autocast_dtype)
    return learner, batch
