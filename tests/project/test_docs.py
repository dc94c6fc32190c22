"""README.md and docs/ against the code: what a reader is told exists, exists, and what they are told to run, runs.

Checked mechanically, in-process (no subprocess):
- every `python -m dreamer ...` / `dreamer ...` command in the pages passes the checks the run makes before it
  creates anything, as `dreamer --check` runs them (torchrun and sbatch lines: their overrides; multirun sweeps
  job by job), all but those of the machine it trains on;
- every relative link resolves, files and #anchors;
- the README: at most 150 lines, names every top-level folder, no dates or CPU model names, its preset table
  lists every preset with the algorithm it trains, its account of the default run is the schema's;
- docs/architecture.md's layout names every module of every package (and none that is gone);
- every dotted config key the manual pages mention is a real key; the resume allow-list is the code's.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shlex
import subprocess
import typing
from pathlib import Path

import hydra
import pytest
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict

from dreamer.check import check_command_line
from dreamer.config import ALGO_CONFIGS, Config, config_key, load_config, register_configs
from dreamer.envs.factory import available_env_names
from dreamer.errors import UserError
from dreamer.run.resume import RESUME_OVERRIDABLE
from tests.support.runs import saved_run

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
README_PATH = REPO_ROOT / "README.md"
README = README_PATH.read_text()
DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
PAGES = [README_PATH, *DOCS]
# Pages that describe the code as it is: every page but RELIABILITY.md, whose rows name the tests and
# faults of their cases (its code blocks and links are checked like every page's).
MANUAL = [README_PATH, *(REPO_ROOT / "docs" / name for name in
                         ("usage.md", "architecture.md", "gpu.md", "PERFORMANCE.md", "LEARNING.md"))]
PACKAGES = sorted(p.parent.name for p in (REPO_ROOT / "dreamer").glob("*/__init__.py"))

FENCE = re.compile(r"^(```|~~~)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
CPU_NAME = re.compile(r"\b(EPYC|Xeon|Ryzen|Threadripper|Opteron|Core i[3579]|Pentium|Celeron|Graviton|Neoverse"
                      r"|Apple M[1-9]|AVX[-0-9]*|lscpu)\b", re.I)
ALGORITHM_NAMES = {"Dreamer V1": "dreamer_v1", "Dreamer V3": "dreamer_v3"}


def rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


# -- reading markdown ----------------------------------------------------------------------------


def split_fences(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(prose lines, code-block lines), each as (line number, text)."""
    prose, code, inside = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            inside = not inside
            continue
        (code if inside else prose).append((number, line))
    return prose, code


def strip_inline_code(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_fences(path.read_text())
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_anchor(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    prose, _ = split_fences(path.read_text())
    return [(number, target) for number, line in prose
            for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", strip_inline_code(line))]


# -- commands ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Command:
    where: str
    text: str
    via: str  # python -m dreamer | dreamer | torchrun | sbatch
    overrides: list[str]
    environ: dict[str, str]
    multirun: bool


def code_commands(path: Path) -> list[tuple[int, str]]:
    """Shell lines of a page's code blocks, continuation lines joined."""
    _, code = split_fences(path.read_text())
    lines, pending, start = [], "", 0
    for number, line in code:
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((start, pending + line))
        pending = ""
    return lines


# A template's placeholders: `experiment=PRESET`, a bare `ENV_OVERRIDES`, `seed=S`.
PLACEHOLDER = re.compile(r"(^|\s|=)[A-Z][A-Z_]*(\s|$)")


def paragraphs(prose: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Prose as (first line number, text joined with spaces): a paragraph ends at a blank line, and
    each table row is one, so an inline command wrapped over two lines is read whole."""
    found, start, lines, previous = [], None, [], None
    for number, line in prose:
        breaks = not line.strip() or line.lstrip().startswith("|") or previous != number - 1
        if breaks and lines:
            found.append((start, " ".join(lines)))
            lines = []
        if line.strip():
            start = number if not lines else start
            lines.append(line.strip())
            if line.lstrip().startswith("|"):
                found.append((start, " ".join(lines)))
                lines = []
        previous = number
    if lines:
        found.append((start, " ".join(lines)))
    return found


def inline_commands(path: Path) -> list[tuple[int, str]]:
    """Commands in `backticks` in prose (a template with placeholders is not a command)."""
    prose, _ = split_fences(path.read_text())
    return [(number, span) for number, text in paragraphs(prose) for span in re.findall(r"`([^`]+)`", text)
            if re.match(r"(python3? -m dreamer|dreamer)(\s|$)", span) and not PLACEHOLDER.search(span)]


def test_inline_commands_are_read_across_a_line_break_and_templates_are_left_out(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `python -m dreamer\nseed=1` first.\n\n| a | `dreamer seed=2` |\n"
                    "| b | `python -m dreamer experiment=PRESET seed=S` |\n\n```\nnot prose\n```\n")
    assert inline_commands(page) == [(1, "python -m dreamer seed=1"), (4, "dreamer seed=2")]


def expand_variables(token: str) -> str:
    """``$HOME/x`` -> ``HOME/x``: a placeholder path, as the shell would put some path there."""
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", token)


def dreamer_arguments(tokens: list[str]) -> tuple[str, list[str], dict[str, str]] | None:
    """(how dreamer is started, the arguments it receives, the environment the command sets) for one
    shell command; None when the command does not start dreamer."""
    environ = {}
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        environ[name] = value
    if tokens[:1] == ["dreamer"]:
        return "dreamer", tokens[1:], environ
    if tokens[:3] in (["python", "-m", "dreamer"], ["python3", "-m", "dreamer"]):
        return "python -m dreamer", tokens[3:], environ
    if tokens[:1] == ["torchrun"] and "dreamer" in tokens:  # torchrun [its flags] -m dreamer ARGS
        at = tokens.index("dreamer")
        if tokens[at - 1] == "-m":
            return "torchrun", tokens[at + 1:], environ
    if tokens[:1] == ["sbatch"] and len(tokens) > 1 and tokens[1].endswith("sbatch_dreamer.sh"):
        return "sbatch", tokens[2:], environ  # the script passes its arguments to python -m dreamer
    return None


STARTS_DREAMER = re.compile(r"(^|\s)dreamer(\s|$)|sbatch_dreamer\.sh")


def parse_command(where: str, line: str) -> list[Command]:
    if not STARTS_DREAMER.search(line.split("#")[0]):
        return []
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as err:
        UNPARSABLE.append(f"{where}: {line.strip()} ({err})")
        return []
    segments, current = [], []
    for token in tokens:
        if token in ("&&", "||", ";", "|"):
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    commands = []
    for segment in segments:
        found = dreamer_arguments(list(segment))
        if found is None:
            continue
        via, arguments, environ = found
        overrides, multirun, skip_next = [], False, False
        for argument in arguments:
            if skip_next:
                skip_next = False
            elif argument in ("-m", "--multirun"):
                multirun = True
            elif argument in ("--cfg", "-c", "--package", "-p"):
                skip_next = True  # its value: job / hydra / all, a package name
            elif not argument.startswith("-"):
                overrides.append(expand_variables(argument))
        commands.append(Command(where, line.strip(), via, overrides, environ, multirun))
    return commands


UNPARSABLE: list[str] = []


def all_commands() -> list[Command]:
    commands = []
    for page in PAGES:
        sources = code_commands(page) + (inline_commands(page) if page in MANUAL else [])
        for number, line in sources:
            commands += parse_command(f"{rel(page)}:{number}", line)
    return commands


COMMANDS = all_commands()


@pytest.fixture(scope="module")
def compose():
    register_configs()
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        @functools.lru_cache(maxsize=None)  # a command shown twice composes once
        def cached(overrides: tuple[str, ...], environ: tuple[tuple[str, str], ...]):
            cfg = hydra.compose("config", overrides=list(overrides), return_hydra_config=True)
            with open_dict(cfg):
                del cfg["hydra"]
            return load_config(cfg, environ=dict(environ))

        def composed(overrides, environ=None):
            """Compose as `python -m dreamer OVERRIDES --cfg job` does (Hydra's own keys included, so a
            launcher override is checked too), then build and validate the run's config."""
            return cached(tuple(overrides), tuple(sorted((environ or {}).items())))
        yield composed
    GlobalHydra.instance().clear()


def test_the_pages_show_dreamer_commands():
    assert len(COMMANDS) >= 20, f"found only {len(COMMANDS)} dreamer commands: the parser is broken"
    assert {"python -m dreamer", "torchrun", "sbatch"} <= {c.via for c in COMMANDS}
    assert any(c.multirun for c in COMMANDS) and any(c.environ for c in COMMANDS)


def test_every_dreamer_command_in_the_docs_is_valid_shell():
    assert not UNPARSABLE, "commands a shell cannot parse:\n" + "\n".join(UNPARSABLE)


@pytest.fixture(scope="module")
def reader_directory(tmp_path_factory) -> Path:
    """A working directory in which the paths the commands name stand as they would for a reader:
    each ``resume=DIR`` a run of its preset (``outputs/PRESET/...``; else the defaults) to continue,
    each ``compile.cache_artifact=FILE`` a file."""
    work = tmp_path_factory.mktemp("reader")
    presets = {p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")}
    for command in COMMANDS:
        for override in command.overrides:
            key, _, value = override.partition("=")
            path = work / value
            if key == "resume" and not path.exists():
                preset = next((part for part in Path(value).parts if part in presets), None)
                saved_run(path, [f"experiment={preset}"] if preset else [])
            elif key == "compile.cache_artifact" and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"")
    return work


@functools.lru_cache(maxsize=None)  # a command shown twice is checked once
def refusal(argv: tuple[str, ...], environ: tuple[tuple[str, str], ...]) -> str | None:
    """The one line `dreamer --check ARGV` ends with (None: it passes), checked in this process."""
    try:
        check_command_line(list(argv), {**os.environ, **dict(environ)}, this_machine=False)
    except UserError as err:
        return str(err)
    return None


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.where)
def test_every_dreamer_command_in_the_docs_passes_the_runs_checks(command, reader_directory, monkeypatch):
    """`dreamer --check` on the command (dreamer.check: composition, every key and value, the
    cross-key rules, episode limits, the run's directories and a resume's checkpoint and overrides;
    a sweep job by job). Explicitly not this machine's checks (``this_machine=False``: the device,
    the env built with this machine's rendering and packages, memory, disk), as for a sweep a
    SLURM launcher runs elsewhere: a GPU command or a preset sized for a bigger box is the docs'
    to show, and each run checks its machine when it starts."""
    monkeypatch.chdir(reader_directory)
    argv = (["-m"] if command.multirun else []) + command.overrides
    found = refusal(tuple(argv), tuple(sorted(command.environ.items())))
    assert found is None, f"{command.where}: `{command.text}` is refused: {found}"


@functools.cache
def env_names(backend: str) -> frozenset[str]:
    return frozenset(available_env_names(backend))


def env_choices(command: Command) -> list[list[str]]:
    """The overrides that pick the command's env (its preset, env group and env keys), one list per
    env a sweep's comma-separated values name."""
    picks = [o for o in command.overrides if o.split("=")[0].lstrip("+~").startswith(("experiment", "env"))]
    choices = [[]]
    for pick in picks:
        key, _, value = pick.partition("=")
        values = value.split(",") if command.multirun else [value]
        choices = [chosen + [f"{key}={v}"] for chosen in choices for v in values]
    return choices


@pytest.mark.parametrize("command", [c for c in COMMANDS if any("env" in o or "experiment" in o for o in c.overrides)],
                         ids=lambda c: c.where)
def test_every_env_a_docs_command_names_exists(command, compose):
    """The run's checks leave the env to the machine that runs it (it is built there): a misspelled
    env.name in the docs would pass them. Each name must be one its backend knows."""
    for overrides in env_choices(command):
        cfg = compose(overrides)
        if cfg.env.import_:
            continue  # a user module registers it
        assert cfg.env.name in env_names(cfg.env.backend), \
            f"{command.where}: `{command.text}` names {cfg.env.backend} env {cfg.env.name!r}, which does not exist"


# -- links ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves(page):
    broken = []
    for number, target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{rel(page)}:{number}: {target} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{rel(page)}:{number}: {target} (no heading #{anchor} in {destination.name})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_anchor_rule_is_githubs():
    assert github_anchor("W&B and sweeps") == "wb-and-sweeps"
    assert github_anchor("The default run (`python -m dreamer`)") == "the-default-run-python--m-dreamer"
    assert github_anchor("Several GPUs: data-parallel learners") == "several-gpus-data-parallel-learners"


# -- the README ----------------------------------------------------------------------------------


def test_the_readme_is_at_most_150_lines():
    lines = len(README.splitlines())
    assert lines <= 150, f"README.md has {lines} lines; move detail to docs/ (at most 150)"


def top_level_folders() -> set[str]:
    """Folders of the repository (tracked by git; on disk, less what .gitignore names, elsewhere)."""
    try:
        files = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                               check=True).stdout.splitlines()
        folders = {f.split("/")[0] for f in files if "/" in f}
    except (OSError, subprocess.CalledProcessError):
        ignored = {".venv", "__pycache__", "outputs", "multirun", "wandb", "build", ".pytest_cache", ".ci-venv"}
        folders = {p.name for p in REPO_ROOT.iterdir() if p.is_dir() and p.name not in ignored
                   and not p.name.endswith(".egg-info")}
    return {f for f in folders if not f.startswith(".")}


def test_the_readme_names_every_top_level_folder():
    section = README[README.index("## Layout"):]
    missing = sorted(f for f in top_level_folders() if f"`{f}/`" not in section)
    assert not missing, f"README Layout: add a line for {missing}"


def test_the_readme_has_no_dates_or_cpu_names():
    dates = DATE.findall(README)
    cpus = sorted({m.group(0) for m in CPU_NAME.finditer(README)})
    assert not dates and not cpus, (f"README.md names dates {dates} / CPUs {cpus}: figures and where they were "
                                    f"measured belong in docs/PERFORMANCE.md or docs/LEARNING.md")


def preset_rows() -> list[tuple[str, str]]:
    """(command, algorithm) of each row of the README's preset table."""
    section = README[README.index("## Presets"):]
    return [(m.group(1), m.group(2).strip()) for m in
            re.finditer(r"^\| `(python -m dreamer[^`]*)` \| ([^|]+) \|", section, re.M)]


def test_the_readme_preset_table_lists_every_preset():
    listed = {"default"}  # the row without experiment=
    for command, _ in preset_rows():
        listed |= set(re.findall(r"experiment=(\w+)", command))
    presets = {p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")}
    assert presets <= listed, f"README preset table: add a row for {sorted(presets - listed)}"


@pytest.mark.parametrize("command,algorithm", preset_rows(), ids=lambda x: x)
def test_each_preset_row_names_the_algorithm_it_trains(command, algorithm, compose):
    assert algorithm in ALGORITHM_NAMES, f"algorithm column {algorithm!r}: one of {sorted(ALGORITHM_NAMES)}"
    cfg = compose(shlex.split(command)[3:])
    assert cfg.algo.name == ALGORITHM_NAMES[algorithm], (
        f"`{command}` trains {cfg.algo.name}, the table says {algorithm}")


def number(pattern: str, text: str = README) -> int:
    match = re.search(pattern, text, re.S)
    assert match, f"README: no match for {pattern!r}: the default run's paragraph changed"
    return int(match.group(1).replace(",", ""))


def test_the_readmes_account_of_the_default_run_is_the_schemas(compose):
    cfg = compose([])
    section = README[README.index("## What the default run does"):README.index("## Presets")]
    assert cfg.algo.name == "dreamer_v3" and "Dreamer V3" in section
    assert cfg.env.backend == "gymnasium" and cfg.env.name in section and not cfg.env.from_pixels
    assert not cfg.compile.enabled and "eager" in section
    assert cfg.train.total_frames == number(r"for (\d+)k env frames", section) * 1000
    agent_steps = cfg.train.total_frames // cfg.env.action_repeat
    assert cfg.env.action_repeat == number(r"At action repeat (\d+)", section)
    assert agent_steps == number(r"that is\s+([\d,]+) agent steps", section)
    assert cfg.collector.init_random_frames == number(r"the first ([\d,]+) are random", section)
    b = cfg.buffer
    assert cfg.train.train_ratio == number(r"`train.train_ratio` (\d+)", section)
    assert (b.batch_size, b.batch_length) == (number(r"batches\s+of (\d+) x", section),
                                              number(r"batches\s+of \d+ x (\d+)", section))
    per_step = cfg.train.train_ratio / (b.batch_size * b.batch_length)
    assert number(r"one update every (\d+) agent steps", section) == round(1 / per_step)
    updates = (agent_steps - cfg.collector.init_random_frames) * per_step
    stated = number(r"about ([\d,]+) updates", section)
    assert abs(stated - updates) <= 0.1 * updates, f"README says about {stated} updates; the schema makes {updates:.0f}"
    assert cfg.eval.every == number(r"evaluates every (\d+) updates", section)
    assert cfg.eval.episodes == number(r"\((\d+) episodes of the (?:sampling|mode) policy\)", section)
    assert f"episodes of the {'sampling' if cfg.eval.policy == 'sample' else 'mode'} policy" in section
    assert cfg.checkpoint.every == number(r"checkpoints every (\d+)", section)


# -- docs/architecture.md's layout ---------------------------------------------------------------

ARCHITECTURE = (REPO_ROOT / "docs" / "architecture.md").read_text()
# Backticked words in a layout row are module names, except these inline code words.
NOT_MODULES = {"python", "dreamer", "train", "error", "Every", "Ratio", "Run", "RunResult", "UserError", "MUJOCO_GL"}


def layout_row(folder: str) -> str:
    layout = ARCHITECTURE[ARCHITECTURE.index("## Layout"):]
    match = re.search(rf"^\| `{re.escape(folder)}/` \|(.*)$", layout, re.M)
    assert match, f"docs/architecture.md Layout has no row for {folder}/"
    return match.group(1)


@pytest.mark.parametrize("folder", ["dreamer", *(f"dreamer/{p}" for p in PACKAGES), "torchrl_ext"])
def test_the_layout_names_every_module_of_each_package(folder):
    row = layout_row(folder)
    named = set(re.findall(r"`([a-z_0-9]+)`", row))
    directory = REPO_ROOT / folder
    modules = {p.stem for p in directory.glob("*.py") if p.stem != "__init__"}
    subpackages = set() if folder == "dreamer" else {  # dreamer/'s packages have rows of their own
        p.name for p in directory.iterdir() if (p / "__init__.py").is_file()}
    missing = sorted(m for m in modules if m not in named)
    missing += sorted(f"{s}/" for s in subpackages if f"`{s}/`" not in row)
    assert not missing, f"docs/architecture.md Layout, {folder}/: add {missing}"
    nested = {p.stem for p in directory.glob("*/*.py") if p.stem != "__init__"}  # v1/models.py, ...
    gone = sorted(named - modules - nested - NOT_MODULES)
    assert not gone, f"docs/architecture.md Layout, {folder}/ names modules that do not exist: {gone}"


def test_the_layout_has_a_row_for_every_top_level_folder():
    for folder in top_level_folders():
        layout_row(folder)


# -- config keys and the resume allow-list -------------------------------------------------------


def config_keys() -> set[str]:
    keys = set()

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            name = prefix + config_key(f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], name + ".")
            else:
                keys.add(name)

    walk(Config, "")
    for algo_cls in ALGO_CONFIGS.values():
        walk(algo_cls, "algo.")
    return keys


SECTIONS = {f.name for f in dataclasses.fields(Config)
            if dataclasses.is_dataclass(typing.get_type_hints(Config)[f.name])}
FILE_SUFFIXES = ("*", ".py", ".yaml", ".json", ".jsonl", ".pt", ".csv", ".png", ".md", ".sh", ".bin", ".mp4")


@pytest.mark.parametrize("page", MANUAL, ids=rel)
def test_every_config_key_the_manual_mentions_exists(page):
    keys = config_keys()
    text = page.read_text()
    mentioned = {m for m in re.findall(r"(?<![\w./$-])([a-z_]+\.[a-z_][a-z_0-9.]*)(?==|`|\s|,|\))", text)
                 if m.split(".")[0] in SECTIONS and not m.endswith(".") and not m.endswith(FILE_SUFFIXES)}
    unknown = sorted(m for m in mentioned if m not in keys and not any(k.startswith(m + ".") for k in keys))
    assert not unknown, f"{rel(page)} mentions config keys that do not exist: {unknown}"


def test_the_config_key_pattern_finds_keys():
    assert "train.train_ratio" in re.findall(r"([a-z_]+\.[a-z_][a-z_0-9.]*)(?==|`|\s|,|\))", README)


def test_the_resume_allow_list_in_the_docs_is_the_codes():
    usage = (REPO_ROOT / "docs" / "usage.md").read_text()
    paragraph = usage[usage.index("May change on resume:"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    stated = {word.removesuffix(".*") for word in re.findall(r"`([a-z_.*]+)`", paragraph)}
    code = set(RESUME_OVERRIDABLE) - {"resume"}
    assert stated == code, f"docs/usage.md says {sorted(stated - code)} extra, {sorted(code - stated)} missing"


def test_no_command_in_the_docs_needs_the_callers_shell_to_expand_a_tilde():
    # `key=~/x` is expanded by bash but passed as is by sh and zsh, and Hydra cannot parse it.
    offending = [c.where for c in COMMANDS if any("=~" in o for o in c.overrides)]
    assert not offending, f"write $HOME instead of ~ in: {offending}"
