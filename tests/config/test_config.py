"""dreamer/config/: schema, validation, Hydra composition, every key used."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest

from dreamer.config import (
    Config,
    DreamerV1Config,
    DreamerV3Config,
    load_config,
    register_configs,
    to_dict,
)
from dreamer.errors import UserError
from tests.support.gpu_checks import CUDA_GRAPHS_ASKED
from tests.support.paths import CONF_DIR, REPO_ROOT
from tests.support.presets import preset_algorithms

# -- plain dicts ---------------------------------------------------------------


def test_load_config_plain_dict_overrides_defaults_and_keeps_the_rest():
    cfg = load_config(
        {"env": {"name": "Pendulum-v1", "action_repeat": 4}, "buffer": {"batch_size": 8}, "seed": 3}
    )
    assert isinstance(cfg, Config)
    assert cfg.env.action_repeat == 4
    assert cfg.buffer.batch_size == 8
    assert cfg.seed == 3
    # Untouched keys keep the schema defaults.
    assert cfg.buffer.batch_length == Config().buffer.batch_length
    assert cfg.algo == Config().algo


def test_load_config_round_trips_to_dict():
    cfg = load_config({"algo": {"name": "dreamer_v1", "state_dim": 7}, "compile": {"enabled": True}})
    assert load_config(to_dict(cfg)) == cfg


def test_load_config_ignores_hydra_section():
    cfg = load_config({"hydra": {"run": {"dir": "x"}}, "seed": 1})
    assert cfg.seed == 1


@pytest.mark.parametrize(
    "section, key, value, allowed",
    [
        ("compile", "backend", "foo", ["inductor", "aot_eager", "eager"]),
        ("env", "backend", "bar", ["gymnasium", "dm_control", "atari"]),
        ("algo", "activation", "gelu", ["elu", "relu", "silu", "tanh"]),
        ("buffer", "pin_memory", "yes", ["auto", "on", "off"]),
        ("compile", "mode", "fast", ["default", "reduce-overhead", "max-autotune"]),
    ],
)
def test_invalid_choice_names_key_and_allowed_values(section, key, value, allowed):
    algo_name = {"name": "dreamer_v1"} if section == "algo" else {}  # activation is V1's
    with pytest.raises(UserError) as err:
        load_config({section: {key: value, **algo_name}})
    msg = str(err.value)
    assert f"{section}.{key}" in msg
    assert value in msg
    for choice in allowed:
        assert choice in msg


def test_invalid_top_level_choice():
    with pytest.raises(UserError, match=r"autocast.*fp16.*auto.*off.*bf16"):
        load_config({"autocast": "fp16"})


def test_compile_mode_with_options_is_rejected_naming_both():
    with pytest.raises(UserError) as err:
        load_config({"compile": {"mode": "max-autotune", "options": {"triton.cudagraphs": False}}})
    msg = str(err.value)
    assert "compile.mode" in msg and "compile.options" in msg


def test_compile_mode_without_options_is_accepted():
    cfg = load_config({"compile": {"mode": "max-autotune-no-cudagraphs", "options": None}})
    assert cfg.compile.mode == "max-autotune-no-cudagraphs"
    assert cfg.compile.options is None


@pytest.mark.gpu_acceptance(CUDA_GRAPHS_ASKED)
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_a_compile_mode_that_brings_cuda_graphs_needs_the_explicit_ask(mode):
    with pytest.raises(UserError, match=rf"compile.mode={mode} brings CUDA graphs, which the actor/value losses "
                                        r"break .*: use compile.mode=max-autotune-no-cudagraphs, or add "
                                        r"compile.cudagraphs=true"):
        load_config({"compile": {"mode": mode, "options": None}})
    cfg = load_config({"compile": {"mode": mode, "options": None, "cudagraphs": True}})
    assert cfg.compile.mode == mode


@pytest.mark.gpu_acceptance(CUDA_GRAPHS_ASKED)
def test_the_cuda_graph_modes_are_the_ones_torch_says_bring_cuda_graphs():
    """CUDAGRAPH_MODES is written out (config validation must not import inductor): check it against torch."""
    import torch._inductor

    from dreamer.config.validate import CUDAGRAPH_MODES

    modes = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    bring = tuple(m for m in modes if torch._inductor.list_mode_options(m).get("triton.cudagraphs"))
    assert bring == CUDAGRAPH_MODES


def test_compile_options_carry_the_cudagraphs_choice():
    from dreamer.system.compile import compile_kwargs

    assert compile_kwargs(load_config({}).compile)["options"]["triton.cudagraphs"] is False
    cfg = load_config({"compile": {"cudagraphs": True}})
    assert compile_kwargs(cfg.compile)["options"]["triton.cudagraphs"] is True


@pytest.mark.parametrize("compile_cfg", [
    {}, {"cudagraphs": True}, {"mode": "reduce-overhead", "options": None, "cudagraphs": True},
    {"mode": "max-autotune", "options": None, "cudagraphs": True},
    {"mode": "max-autotune-no-cudagraphs", "options": None},
])
def test_the_rssm_step_never_compiles_with_cuda_graphs(compile_cfg):
    """The rollout stacks every step's outputs: CUDA-graph replay would overwrite them."""
    import torch._inductor

    from dreamer.system.compile import rssm_step_compile_kwargs

    kwargs = rssm_step_compile_kwargs(load_config({"compile": compile_cfg}).compile)
    options = {**torch._inductor.list_mode_options(kwargs.get("mode", "default")), **kwargs.get("options", {})}
    assert not options.get("triton.cudagraphs"), kwargs
    assert "mode" not in kwargs or "options" not in kwargs, "torch.compile takes one of the two"
    if compile_cfg.get("mode", "").startswith("max-autotune"):
        assert kwargs["mode"] == "max-autotune-no-cudagraphs"


@pytest.mark.gpu_acceptance(CUDA_GRAPHS_ASKED)
def test_collectors_on_cuda_are_refused_in_one_line():
    with pytest.raises(UserError, match="collector.device=cuda: TorchRL hands CUDA weights to worker processes by "
                                        "reference.*use collector.device=cpu"):
        load_config({"collector": {"device": "cuda"}})


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("buffer", "batch_size", 0),
        ("buffer", "batch_length", -3),
        ("buffer", "capacity", 0),
        ("env", "image_size", -1),
        ("env", "action_repeat", 0),
        ("algo", "state_dim", 0),
        ("algo", "world_model_lr", 0.0),
        ("checkpoint", "keep", 0),
        ("train", "train_ratio", -1.0),
        ("collector", "num_workers", -1),
        ("collector", "init_random_frames", -1),
        ("algo", "free_nats", -0.5),
        ("eval", "openloop_context", 0),
        ("eval", "openloop_sequences", 0),
    ],
)
def test_non_positive_sizes_are_rejected(section, key, value):
    with pytest.raises(UserError, match=rf"{section}\.{key}"):
        load_config({section: {key: value}})


def test_zero_learner_threads_is_rejected():
    # threads=0 would reach torch.set_num_threads(0) (a RuntimeError traceback);
    # like every other size it must be a one-line UserError naming the key.
    with pytest.raises(UserError, match=r"threads"):
        load_config({"threads": 0})


def test_sequences_longer_than_an_episode_are_accepted():
    """Replayed sequences run across episode ends (the RSSM resets at is_first)."""
    cfg = load_config({"env": {"max_episode_steps": 20}, "buffer": {"batch_length": 64}})
    assert cfg.buffer.batch_length == 64


def test_capacity_smaller_than_sequence_is_rejected():
    with pytest.raises(UserError, match="buffer.capacity"):
        load_config({"buffer": {"capacity": 10, "batch_length": 20}})


@pytest.mark.parametrize(
    "data, key",
    [
        ({"bogus": 1}, "bogus"),
        ({"env": {"nmae": "Pendulum-v1"}}, "env.nmae"),
        ({"algo": {"lr": 1e-3}}, "algo.lr"),
    ],
)
def test_unknown_key_is_rejected_by_its_dotted_path(data, key):
    with pytest.raises(UserError, match=re.escape(key)):
        load_config(data)


def test_pixel_model_input_must_be_64():
    with pytest.raises(UserError, match="env.image_size"):
        load_config({"env": {"from_pixels": True, "image_size": 32, "render_size": 64}})


def test_atari_requires_pixels():
    with pytest.raises(UserError, match="from_pixels"):
        load_config({"env": {"backend": "atari", "name": "Pong", "from_pixels": False}})


@pytest.mark.parametrize("device, ok", [("auto", True), ("cpu", True), ("cuda:1", True), ("tpu", False)])
def test_device_choices(device, ok):
    if ok:
        assert load_config({"device": device}).device == device
    else:
        with pytest.raises(UserError, match="device"):
            load_config({"device": device})


# -- Hydra composition ---------------------------------------------------------


def _names(group: str) -> list[str]:
    """A group's options: its YAML files and the dataclass defaults in the ConfigStore."""
    from hydra.core.config_store import ConfigStore

    register_configs()
    stored = ConfigStore.instance().list(group) if group in ConfigStore.instance().repo else []
    return sorted({p.stem for p in (CONF_DIR / group).glob("*.yaml")} | {Path(n).stem for n in stored})


def test_conf_dir_resolves_relative_to_tests():
    assert CONF_DIR == Path(__file__).resolve().parents[2] / "conf"
    assert (CONF_DIR / "config.yaml").is_file()


@pytest.mark.parametrize("experiment", _names("experiment"))
def test_every_experiment_preset_composes_and_validates(compose, experiment):
    cfg = load_config(compose([f"experiment={experiment}"]))
    assert cfg.experiment == experiment


OPTION_GROUPS = ("env", "logger", "compile", "buffer", "collector", "algo", "model")


def test_no_preset_shares_a_name_with_another_groups_option():
    # experiment=dmc_proprio beside env=dmc_proprio read as one thing; they were not. conf/sweep/
    # holds W&B sweep files, but Hydra composes +sweep=NAME from it all the same.
    shared = {(group, name) for group in (*OPTION_GROUPS, "sweep")
              for name in set(_names("experiment")) & set(_names(group))}
    assert not shared, f"presets named like another group's option: {sorted(shared)}"


@pytest.mark.parametrize("experiment", [name for name in _names("experiment") if name.endswith(("_v1", "_v3"))])
def test_a_preset_whose_name_says_an_algorithm_trains_it(experiment):
    assert preset_algorithms()[experiment] == f"dreamer_{experiment[-2:]}"


@pytest.mark.parametrize(
    "group, option",
    [(g, o) for g in OPTION_GROUPS if g != "model" for o in _names(g)],
)
def test_every_group_option_composes_and_validates(compose, group, option):
    load_config(compose([f"{group}={option}"]))  # on the base: no preset by default


def test_smoke_preset_is_pixels_and_small(compose):
    cfg = load_config(compose(["experiment=smoke"]))
    assert cfg.env.from_pixels
    assert cfg.buffer.batch_length <= cfg.env.max_episode_steps


def test_hydra_compile_mode_alone_is_rejected(compose):
    with pytest.raises(UserError, match="compile.options"):
        load_config(compose(["compile.mode=default"]))


def test_hydra_compile_mode_with_null_options_is_accepted(compose):
    cfg = load_config(compose(["compile.mode=default", "compile.options=null"]))
    assert cfg.compile.mode == "default"
    assert cfg.compile.options is None


def test_hydra_bad_choice_is_a_user_error(compose):
    with pytest.raises(UserError, match=r"compile\.backend.*inductor"):
        load_config(compose(["compile.backend=foo"]))


# -- every key is read ---------------------------------------------------------


def _sections(cls=Config, path=""):
    """{section path: its dataclasses} for every dataclass-valued field (root: "")."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        classes = [a for a in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(a)]
        classes = classes or ([hints[f.name]] if dataclasses.is_dataclass(hints[f.name]) else [])
        for c in classes:
            sub = path + f.name
            out.setdefault(sub, set()).add(c)
            for deeper, more in _sections(c, sub + ".").items():
                out.setdefault(deeper, set()).update(more)
    return out


class _ConfigReads:
    """Which dotted config keys the code under dreamer/ reads, by section.

    An attribute read ``x.name`` counts as ``<section>.name`` only when ``x`` is
    known to be that section's config: a parameter (or class attribute) annotated
    with the section's class (``env_cfg: EnvConfig``; the algo section also
    through its base class), the chain ``<root>.<section>`` on a root ``Config``,
    or a name or ``self.`` attribute bound to one of those (``c = collector_cfg``,
    ``b = self.r.cfg.buffer``, ``self.cfg = dataclasses.replace(cfg, ...)``).
    The same leaf name read on another section's config does not count.
    """

    def __init__(self, root: Path):
        sections = _sections()
        self.children = {"": {s for s in sections if "." not in s}}
        for s in sections:
            parent, _, child = s.rpartition(".")
            if parent:
                self.children.setdefault(parent, set()).add(child)
        self.leaves = {"": {n for _, n in _leaf_fields(Config) if "." not in _}}
        for path, name in _leaf_fields(Config):
            section = path.rpartition(".")[0]
            if section:
                self.leaves.setdefault(section, set()).add(name)
        # Class name -> the sections it configures (a base class: every section a subclass is).
        self.by_class: dict[str, set[str]] = {Config.__name__: {""}}
        for section, classes in sections.items():
            for c in classes:
                for k in c.__mro__:
                    if dataclasses.is_dataclass(k):
                        self.by_class.setdefault(k.__name__, set()).add(section)
        self.class_re = re.compile(r"\b(" + "|".join(map(re.escape, self.by_class)) + r")\b")
        # dreamer/config/ defines and validates the keys; of it, only the train ratio's
        # arithmetic (ratio.py) is a use, for every caller.
        self.trees = [ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))
                      if p.parent.name != "config" or p.name == "ratio.py"]
        self.class_attrs: dict[str, dict[str, set[str]]] = {}  # class -> attribute -> sections
        self.class_bases: dict[str, list[str]] = {}  # class -> its base classes' names
        self.class_body: dict[str, list] = {}
        self.reads: set[str] = set()
        for _ in range(3):  # attributes bound from other attributes: to a fixed point
            for tree in self.trees:
                self._scope(tree.body, {}, None)
        self.reads.clear()
        for tree in self.trees:
            self._scope(tree.body, {}, None, record=True)

    def _annotated(self, annotation) -> set[str]:
        if annotation is None:
            return set()
        text = ast.unparse(annotation)
        return {s for name in self.class_re.findall(text) for s in self.by_class[name]}

    def _resolve(self, node, env, cls) -> set[str]:
        if isinstance(node, ast.Name):
            return env.get(node.id, set())
        if isinstance(node, ast.Call):  # dataclasses.replace(cfg, ...) keeps cfg's type
            fn = ast.unparse(node.func)
            if fn in ("replace", "dataclasses.replace", "copy.copy", "copy.deepcopy") and node.args:
                return self._resolve(node.args[0], env, cls)
            return set()
        if isinstance(node, ast.Attribute):
            out = {f"{s}.{node.attr}".lstrip(".") for s in self._resolve(node.value, env, cls)
                   if node.attr in self.children.get(s, ())}
            if isinstance(node.value, ast.Name) and node.value.id == "self" and cls is not None:
                for c in self._lineage(cls):  # set in a base class's __init__, read in a subclass
                    out |= self.class_attrs.get(c, {}).get(node.attr, set())
            elif not out:  # obj.cfg on another object: any class's attribute of that name
                for attrs in self.class_attrs.values():
                    out |= attrs.get(node.attr, set())
            return out
        return set()

    def _lineage(self, cls: str) -> list[str]:
        seen, todo = [], [cls]
        while todo:
            c = todo.pop()
            if c not in seen:
                seen.append(c)
                todo.extend(self.class_bases.get(c, ()))
        return seen

    def _bind(self, target, value, env, cls):
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            for t, v in zip(target.elts, value.elts):
                self._bind(t, v, env, cls)
            return
        sections = self._resolve(value, env, cls)
        if not sections:
            return
        if isinstance(target, ast.Name):
            env[target.id] = env.get(target.id, set()) | sections
        elif (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
              and target.value.id == "self" and cls is not None):
            attrs = self.class_attrs.setdefault(cls, {})
            attrs[target.attr] = attrs.get(target.attr, set()) | sections

    def _own_nodes(self, body):
        """The nodes of a scope's body, not descending into nested functions and classes."""
        stack = list(reversed(body))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                stack.extend(reversed(list(ast.iter_child_nodes(node))))

    def _scope(self, body, outer, cls, record=False):
        env = {k: set(v) for k, v in outer.items()}
        nodes = list(self._own_nodes(body))
        for _ in range(3):  # aliases of aliases, whatever their order in the body
            for node in nodes:
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        self._bind(target, node.value, env, cls)
                elif isinstance(node, ast.AnnAssign):
                    if node.value is not None:
                        self._bind(node.target, node.value, env, cls)
                    annotated = self._annotated(node.annotation)
                    if annotated and isinstance(node.target, ast.Name):
                        if cls is not None and body is self.class_body.get(cls):
                            self.class_attrs.setdefault(cls, {}).setdefault(node.target.id, set()).update(annotated)
                        else:
                            env.setdefault(node.target.id, set()).update(annotated)
                elif isinstance(node, (ast.With, ast.AsyncWith)):
                    for item in node.items:
                        if item.optional_vars is not None:
                            self._bind(item.optional_vars, item.context_expr, env, cls)
        for node in nodes:
            if record and isinstance(node, ast.Attribute):
                for s in self._resolve(node.value, env, cls):
                    if node.attr in self.leaves.get(s, ()):
                        self.reads.add(f"{s}.{node.attr}".lstrip("."))
            if isinstance(node, ast.ClassDef):
                self.class_body[node.name] = node.body
                self.class_bases[node.name] = [ast.unparse(b).rpartition(".")[2] for b in node.bases]
                self._scope(node.body, env, node.name, record)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = dict(env)
                args = node.args
                for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                    if a is not None:
                        inner[a.arg] = self._annotated(a.annotation)
                body = node.body if isinstance(node.body, list) else [ast.Expr(node.body)]
                self._scope(body, inner, cls, record)


@pytest.fixture(scope="module")
def config_reads():
    return _ConfigReads(REPO_ROOT / "dreamer")


def _leaf_fields(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        # Config.algo is a Union of the algorithms' classes: walk each of them.
        classes = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or [tp]
        if all(dataclasses.is_dataclass(c) for c in classes):
            for c in classes:
                yield from _leaf_fields(c, prefix + f.name + ".")
        else:
            yield prefix + f.name, f.name


def test_every_config_key_is_read_somewhere(config_reads):
    """Each dotted key is read on its own section's config: a never-read profiling.mode
    does not pass because logger.mode (another section's `mode`) is read."""
    unread = sorted({path for path, _ in _leaf_fields(Config)} - config_reads.reads)
    assert not unread, f"config keys never read outside dreamer/config/: {', '.join(unread)}"



def test_the_key_check_counts_a_read_only_on_its_own_section(tmp_path):
    """The check itself: reads through annotated parameters, aliases, ``cfg.<section>``
    chains, ``self.`` attributes (also a base class's) count for their own section only."""
    (tmp_path / "mod.py").write_text(
        "import dataclasses\n"
        "def f(lc: LoggerConfig, other):\n"
        "    return lc.mode, other.backend\n"  # other: unknown, counts for nothing
        "def g(cfg: Config):\n"
        "    b, t = cfg.buffer, cfg.train\n"
        "    return b.batch_size, t.total_frames, cfg.seed, cfg.eval.every\n"
        "class Base:\n"
        "    def __init__(self, pc: ProfilingConfig, run):\n"
        "        self.pc = dataclasses.replace(pc, enabled=False)\n"
        "        self.r = run\n"
        "class Child(Base):\n"
        "    def go(self):\n"
        "        return self.pc.first_update, self.r.cfg.checkpoint.keep\n"
        "class Holder:\n"
        "    cfg: Config\n"
    )
    reads = _ConfigReads(tmp_path).reads
    assert reads == {"logger.mode", "buffer.batch_size", "train.total_frames", "seed", "eval.every",
                     "profiling.first_update", "checkpoint.keep"}


# -- Dreamer V3 keys -------------------------------------------------------------


def test_algo_dreamer_v3_selects_v3_with_paper_losses_at_cpu_scale(compose):
    cfg = load_config(compose(["algo=dreamer_v3"]))
    a = cfg.algo
    assert a.name == "dreamer_v3"
    assert (a.num_categoricals, a.num_classes, a.unimix) == (16, 16, 0.01)
    assert (a.free_bits, a.dyn_loss_scale, a.rep_loss_scale, a.num_bins) == (1.0, 0.5, 0.1, 255)
    assert (a.agc, a.adam_eps, a.return_norm_rate, a.slow_critic_tau) == (0.3, 1e-20, 0.01, 0.02)
    # The envs and collectors carry V3's categorical latent, not V1's state_dim.
    assert a.latent_state_dim == 16 * 16
    assert load_config(compose(["algo=dreamer_v1"])).algo.latent_state_dim == DreamerV1Config().state_dim


def test_small_preset_is_v3_on_pendulum_states(compose):
    cfg = load_config(compose(["experiment=small"]))
    assert cfg.algo.name == "dreamer_v3"
    assert cfg.env.name == "Pendulum-v1" and not cfg.env.from_pixels


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("name", "dreamer_v2", "choose one of: dreamer_v1, dreamer_v3"),
        ("num_categoricals", 0, "algo.num_categoricals=0 must be > 0"),
        ("num_classes", -4, "algo.num_classes=-4 must be > 0"),
        ("mlp_layers", 0, "algo.mlp_layers=0 must be > 0"),
        ("unimix", 1.0, "algo.unimix=1.0 must be in [0.0, 1.0)"),
        ("free_bits", -1.0, "algo.free_bits=-1.0 must be >= 0"),
        ("dyn_loss_scale", -0.5, "algo.dyn_loss_scale=-0.5 must be >= 0"),
        ("agc", -0.3, "algo.agc=-0.3 must be >= 0"),
        ("lr_warmup_steps", -1, "algo.lr_warmup_steps=-1 must be >= 0"),
        ("slow_critic_tau", 1.5, "algo.slow_critic_tau=1.5 is an EMA rate: it must be in (0, 1]"),
        ("return_norm_rate", 0.0, "algo.return_norm_rate=0.0"),
        ("num_bins", 254, "algo.num_bins=254 must be odd"),
        ("actor_grad", "backprop", "choose one of: auto, dynamics, reinforce"),
        ("gru_blocks", 3, "algo.rssm_hidden_dim=64 does not split into algo.gru_blocks=3"),
        ("replay_value_scale", -0.3, "algo.replay_value_scale=-0.3 must be >= 0"),
    ],
)
def test_bad_v3_keys_are_one_line_errors_naming_the_key(key, value, message):
    with pytest.raises(UserError) as err:
        load_config({"algo": {"name": "dreamer_v3", key: value}})
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_a_v1_slow_value_rate_outside_0_to_1_is_one_line_naming_the_key(value):
    with pytest.raises(UserError) as err:
        load_config({"algo": {"name": "dreamer_v1", "slow_value_tau": value}})
    assert f"algo.slow_value_tau={value} must be in [0.0, 1.0)" in str(err.value)
    assert "\n" not in str(err.value)


# -- model= size presets ---------------------------------------------------------


def test_no_size_preset_keeps_the_algo_and_experiment_sizes(compose):
    cfg = load_config(compose([]))
    assert cfg.model is None
    # DreamerV3Config's CPU scale: 64 / 64, 16 x 16 latent, 16 channels, 2 layers.
    a = cfg.algo
    assert (a.rssm_hidden_dim, a.hidden_dim, a.encoder_channels, a.num_classes, a.mlp_layers) == (64, 64, 16, 16, 2)


@pytest.mark.parametrize(
    "experiment, size, rssm_hidden_dim, num_classes",
    [("small", "size12m", 2048, 16), ("atari100k_v3", "size1m", 512, 4), ("dmc_proprio_v3", "size50m", 4096, 32)],
)
def test_a_size_preset_wins_over_any_experiments_sizes(compose, experiment, size, rssm_hidden_dim, num_classes):
    # small keeps the schema's sizes; atari100k_v3 and dmc_proprio_v3 pick a size preset.
    cfg = load_config(compose([f"experiment={experiment}", f"model={size}"]))
    assert cfg.model == size and cfg.experiment == experiment
    assert (cfg.algo.rssm_hidden_dim, cfg.algo.num_classes) == (rssm_hidden_dim, num_classes)


def test_a_size_preset_with_dreamer_v1_is_one_line_naming_the_fix(compose):
    with pytest.raises(UserError) as err:
        load_config(compose(["experiment=small_v1", "model=size12m"]))
    msg = str(err.value)
    assert "model=size12m is a DreamerV3 size preset" in msg and "algo=dreamer_v3" in msg
    assert "\n" not in msg


# -- env.import (a Python keyword as a config key) ---------------------------------


def test_env_import_is_set_by_its_yaml_name_and_round_trips(compose):
    cfg = load_config(compose(["env=gym", "env.name=MyEnv-v0", "env.import=mypkg.envs"]))
    assert cfg.env.import_ == "mypkg.envs"
    saved = to_dict(cfg)  # config.json, checkpoints, W&B
    assert saved["env"]["import"] == "mypkg.envs" and "import_" not in saved["env"]
    assert load_config(saved) == cfg


def test_env_import_typo_is_an_unknown_key_listing_import():
    with pytest.raises(UserError) as err:
        load_config({"env": {"imports": "mypkg.envs"}})
    assert "env.imports" in str(err.value) and "import" in str(err.value).split("known keys here:")[1]


# -- Atari no-op starts -----------------------------------------------------------


@pytest.mark.parametrize(
    "env, message",
    [
        ({"noop_max": -1}, "env.noop_max=-1 must be >= 0"),
        ({"backend": "gymnasium", "noop_max": 30}, "env.noop_max=30 is for Atari"),
    ],
)
def test_bad_noop_max_is_one_line(env, message):
    with pytest.raises(UserError, match=re.escape(message)):
        load_config({"env": env})


# -- one class per algorithm ----------------------------------------------------------


def test_algo_name_picks_the_algorithms_class():
    assert isinstance(load_config({}).algo, DreamerV3Config)
    v3 = load_config({"algo": {"name": "dreamer_v3", "num_classes": 8}})
    assert isinstance(v3.algo, DreamerV3Config) and v3.algo.num_classes == 8
    assert v3.algo.latent_state_dim == 16 * 8
    assert load_config({"algo": {"name": "dreamer_v1", "state_dim": 7}}).algo.latent_state_dim == 7
    assert load_config(to_dict(v3)) == v3


@pytest.mark.parametrize(
    "algo, message",
    [
        ({"name": "dreamer_v1", "free_bits": 2.0},
         "algo.free_bits is a dreamer_v3 key, but algo.name=dreamer_v1: add algo=dreamer_v3 or drop it"),
        ({"name": "dreamer_v3", "state_dim": 8},
         "algo.state_dim is a dreamer_v1 key, but algo.name=dreamer_v3: add algo=dreamer_v1 or drop it"),
        ({"name": "dreamer_v3", "channels_last": False},
         "algo.channels_last is a dreamer_v1 key, but algo.name=dreamer_v3: add algo=dreamer_v1 or drop it"),
    ],
)
def test_a_key_of_the_other_algorithm_is_one_line_naming_it_and_the_fix(algo, message):
    with pytest.raises(UserError) as err:
        load_config({"algo": algo})
    assert str(err.value) == message


def test_a_key_of_the_other_algorithm_on_the_command_line_is_one_line(compose):
    with pytest.raises(UserError) as err:
        load_config(compose(["experiment=small_v1", "algo.free_bits=2"]))
    assert str(err.value) == (
        "algo.free_bits is a dreamer_v3 key, but algo.name=dreamer_v1: add algo=dreamer_v3 or drop it"
    )
    with pytest.raises(UserError, match=r"^algo.state_dim is a dreamer_v1 key, but algo.name=dreamer_v3"):
        load_config(compose(["experiment=smoke", "algo=dreamer_v3"]))


def test_renaming_the_algorithm_alone_points_to_the_group(compose):
    with pytest.raises(UserError) as err:
        load_config(compose(["experiment=small_v1", "algo.name=dreamer_v3"]))
    assert "choose the algorithm with algo=dreamer_v3" in str(err.value) and "\n" not in str(err.value)


def test_unknown_algo_key_is_still_one_line(compose):
    with pytest.raises(UserError) as err:
        load_config(compose(["algo.lr=1e-3"]))
    assert str(err.value).startswith("unknown config key algo.lr; known keys here:") and "\n" not in str(err.value)


# -- one source of defaults: the dataclasses ---------------------------------------------


@pytest.mark.parametrize("algo, cls", [("dreamer_v1", DreamerV1Config), ("dreamer_v3", DreamerV3Config)])
def test_algo_group_options_are_the_dataclass_defaults(compose, algo, cls):
    composed = to_dict(load_config(compose([f"algo={algo}"])))["algo"]
    assert composed == to_dict(cls())


def test_no_config_group_file_repeats_a_dataclass_default():
    """A default is written once, in dreamer/config/schema.py: a group file (or
    conf/config.yaml) that sets a key to the value the dataclass already has is a
    second copy that would silently win once the dataclass changes."""
    import yaml

    from dreamer.config import ALGO_CONFIGS, config_key

    sections = typing.get_type_hints(Config)
    files = [("", CONF_DIR / "config.yaml")] + [
        (p.parent.name, p)
        for p in sorted(CONF_DIR.glob("*/*.yaml"))
        if p.parent.name not in ("experiment", "model", "env", "sweep", "hydra")
    ]
    copies = []
    for group, path in files:
        data = yaml.safe_load(path.read_text()) or {}
        if group == "":
            instance = Config()
            data = {k: v for k, v in data.items() if k not in ("defaults", "hydra")}
        elif group == "algo":
            instance = ALGO_CONFIGS[data.get("name", path.stem)]()
        else:
            instance = sections[group]()
        defaults = {config_key(f.name): getattr(instance, f.name) for f in dataclasses.fields(instance)}
        copies += [f"{path.relative_to(CONF_DIR)}: {k}={v!r}" for k, v in data.items()
                   if k in defaults and not dataclasses.is_dataclass(defaults[k]) and defaults[k] == v
                   and not (group == "algo" and k == "name")]
    assert not copies, "keys set to their dataclass default (drop them): " + "; ".join(copies)
