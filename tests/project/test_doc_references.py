"""What README.md and docs/ point at, exists; every config key is in the manual; figures stay a reference.

- A repository path written in backticks in a page's prose, or opened by a code block's command,
  exists (a file, a folder, a test function). What counts as a path, and the few things that look
  like one without being in the repository (run outputs, the user's own files, placeholders), are
  the explicit rules below.
- Every config key (each dotted leaf of the composed config, both algorithms) appears in docs/usage.md.
- docs/PERFORMANCE.md and docs/LEARNING.md are references: no table cell over ~300 characters.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from tests.project.test_docs import PAGES, REPO_ROOT, config_keys, rel, split_fences

USAGE = REPO_ROOT / "docs" / "usage.md"
REFERENCES = [REPO_ROOT / "docs" / name for name in ("PERFORMANCE.md", "LEARNING.md")]
MAX_CELL = 300

# A backticked word is a repository path when it has a "/" or ends in one of these.
PATH_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".sh", ".json", ".jsonl", ".toml", ".txt", ".png", ".pt",
                 ".bin", ".csv", ".mp4", ".gz")
# What a run writes (into its run directory, outputs/, multirun/ or traces/): documented, never in the repository.
RUN_OUTPUT_DIRS = {"outputs", "multirun", "traces", "checkpoints", "videos", "csv", "wandb", ".hydra", "<run dir>"}
RUN_OUTPUT_FILES = {
    "config.json", "metrics.jsonl", "summary.json", "learning_curve.png", "compile_cache.bin", "wandb_run.json",
    "run.lock", "learner_trace.json", "collector_<pid>_trace.json", "merged_trace.json",
    "learning_check.json", "learning_suite.json", "learning_suite.md", "TASK.png", "multirun.yaml",
    "ckpt_N.pt",
}
# Files a page's own commands make a line or two earlier.
MADE_BY_THE_PAGE = {"torch-pin.txt"}
# Placeholders a reader replaces: <anything>, and these capitalised words.
PLACEHOLDER_WORDS = ("NAME", "DATE_TIME", "DATE", "TASK", "SWEEP_ID", "ENTITY", "MODULE", "DIR", "OUT", "ID")
PLACEHOLDER = re.compile(r"<[^>]*>|\b(?:" + "|".join(PLACEHOLDER_WORDS) + r")\b")
TOKEN = re.compile(r"(?:<[^>]*>|[^\s<])+")  # "<run dir>/run.lock" is one token
GIT_OBJECT = re.compile(r"^[0-9a-f]{7,40}:")  # eab1ae3:scripts/x.py names a file in history


def repository_paths() -> tuple[set[str], set[str]]:
    """(files, folders) of the working tree: tracked, or new and not ignored."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the files on disk
        skip = {".git", ".venv", "outputs", "multirun", "wandb", "__pycache__", ".pytest_cache"}
        listed = [str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.rglob("*")
                  if p.is_file() and not skip & set(p.relative_to(REPO_ROOT).parts)]
    files = {f for f in listed if (REPO_ROOT / f).exists()}
    folders = {str(parent) for f in files for parent in Path(f).parents if str(parent) != "."}
    return files, folders


FILES, FOLDERS = repository_paths()
TOP_LEVEL = {p.split("/")[0] for p in FILES}


def path_tokens(span: str) -> list[str]:
    """The words of one inline code span that name a path (a key=value's value counts)."""
    if span.startswith("## ") and span.endswith(" ##"):  # a profiler range name: "## train/sample ##"
        return []
    found = []
    for token in TOKEN.findall(span):
        token = token.strip("(),;:").rstrip(".")
        if token.startswith("-") or "://" in token:
            continue
        token = token.split("=", 1)[1] if "=" in token else token
        if "/" in token or token.endswith(PATH_SUFFIXES):
            found.append(token)
    return found


def is_run_output(path: str) -> bool:
    return path.split("/")[0] in RUN_OUTPUT_DIRS or path in RUN_OUTPUT_FILES or path in MADE_BY_THE_PAGE


def outside_the_repository(path: str) -> bool:
    """The user's machine (an absolute, home or $VARIABLE path, or one under a <placeholder> such as
    <prefix>), or a file of the repository's history (commit:path)."""
    return path.startswith(("/", "~", "$")) or bool(re.match(r"<[^>]*>/", path)) or bool(GIT_OBJECT.match(path))


@lru_cache(maxsize=None)
def exists(path: str) -> bool:
    """A file or folder of the repository: from its root when the path starts at a top-level entry,
    else the tail of one (`harness.py`, `hydra/launcher/`, `v1/` in a row that names their folder);
    `file.py::test_name` also needs the test; placeholders match any name."""
    path, _, test = path.partition("::")
    path = path.rstrip("/")
    candidates = FILES | FOLDERS
    if PLACEHOLDER.search(path) or "*" in path:
        pattern = PLACEHOLDER.sub("*", path)
        matches = [p for p in candidates if fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, "*/" + pattern)]
        return bool(matches)
    if path.split("/")[0] in TOP_LEVEL:
        found = [path] if path in candidates else []
    else:
        found = [p for p in candidates if p == path or p.endswith("/" + path)]
    if not found or not test:
        return bool(found)
    name = re.sub(r"\[.*\]$", "", test)
    return any(re.search(rf"^\s*def {re.escape(name)}\(", (REPO_ROOT / p).read_text(), re.M)
               for p in found if p in FILES)


def code_block_paths(line: str) -> list[str]:
    """The words of a code-block line that start at a top-level entry of the repository
    (`python scripts/x.py`, `conf/sweep/y.yaml`): the paths a reader's shell will open."""
    found = []
    for token in TOKEN.findall(line.split(" #")[0]):
        token = token.strip("'\"(),;").split("=", 1)[-1]
        if "/" in token and token.split("/")[0] in TOP_LEVEL:
            found.append(token)
    return found


def missing_paths(page: Path) -> list[str]:
    prose, code = split_fences(page.read_text())
    named = [(number, path) for number, line in prose for span in re.findall(r"`([^`]+)`", line)
             for path in path_tokens(span)]
    named += [(number, path) for number, line in code for path in code_block_paths(line)]
    return [f"{rel(page)}:{number}: `{path}`" for number, path in named
            if not (is_run_output(path) or outside_the_repository(path) or exists(path))]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_repository_path_the_page_names_exists(page):
    missing = missing_paths(page)
    assert not missing, "paths in backticks that are not in the repository:\n" + "\n".join(missing)


def test_a_code_block_path_is_checked_from_the_repository_root():
    assert code_block_paths("python scripts/plot_runs.py outputs/x --out runs.png  # see docs/x.md") == [
        "scripts/plot_runs.py"]
    assert code_block_paths("wandb sweep --project dreamer conf/sweep/smoke_train_ratio.yaml") == [
        "conf/sweep/smoke_train_ratio.yaml"]
    assert exists("conf/sweep/smoke_train_ratio.yaml") and not exists("conf/sweep/smoke.yaml")


def test_the_path_rules_tell_paths_from_other_words():
    assert path_tokens("python scripts/learning_check.py --suite cpu") == ["scripts/learning_check.py"]
    assert path_tokens("hydra.run.dir=outputs/x") == ["outputs/x"]
    assert path_tokens("<run dir>/run.lock") == ["<run dir>/run.lock"]
    assert path_tokens("## train/sample ##") == [] and path_tokens("algo.actor_grad=reinforce") == []
    assert exists("benchmarks/harness.py") and not exists("benchmarks/timing.py")
    assert exists("harness.py") and exists("hydra/launcher/") and not exists("tests/data/dreamerv3_published.yaml")
    assert exists("conf/experiment/NAME.yaml") and exists("dreamer/algos/<name>/models.py")
    assert not exists("conf/experiments/<name>.yaml")
    assert exists("tests/project/test_doc_references.py::test_the_path_rules_tell_paths_from_other_words")
    assert not exists("tests/project/test_doc_references.py::test_that_is_not_there")
    assert is_run_output("outputs/<experiment>/<date>_<time>/") and is_run_output("metrics.jsonl")
    assert outside_the_repository("$HOME/.cache") and outside_the_repository("eab1ae3:scripts/x.py")


def test_every_config_key_is_in_the_usage_page():
    """By its dotted name; an algo key also by its own name in backticks (the algorithms section
    lists them so, under its heading)."""
    usage = USAGE.read_text()
    missing = sorted(key for key in config_keys()
                     if not re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", usage)
                     and not (key.startswith("algo.") and f"`{key.removeprefix('algo.')}`" in usage))
    assert not missing, f"docs/usage.md never mentions the config keys {missing}"


def long_cells(page: Path) -> list[str]:
    prose, _ = split_fences(page.read_text())
    found = []
    for number, line in prose:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            found += [f"{rel(page)}:{number}: a cell of {len(cell)} characters" for cell in cells
                      if len(cell) > MAX_CELL]
    return found


@pytest.mark.parametrize("page", REFERENCES, ids=rel)
def test_the_figure_pages_are_references_with_short_cells(page):
    too_long = long_cells(page)
    assert not too_long, (f"keep each cell at most {MAX_CELL} characters (the current figure, its command, "
                          "machine and date; the story belongs in the commit message):\n" + "\n".join(too_long))
