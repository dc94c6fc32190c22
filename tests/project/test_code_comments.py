"""Code and YAML say what and why, not when or on which machine: no dates and
no CPU names in the code folders (figures live in docs/PERFORMANCE.md and
docs/LEARNING.md, next to their command and CPU)."""

from __future__ import annotations

import re

import pytest

from tests.support.paths import REPO_ROOT

CODE_FOLDERS = ("dreamer", "torchrl_ext", "hydra_plugins", "conf", "scripts", "benchmarks")
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".sh", ".md", ".toml", ".txt", ".cfg"}
LAB_NOTE = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|EPYC|Xeon|AVX")


def _text_files(folder: str):
    for path in sorted((REPO_ROOT / folder).rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
            yield path


@pytest.mark.parametrize("folder", CODE_FOLDERS)
def test_no_dates_or_cpu_names_in_code_folders(folder):
    found = [f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()[:100]}"
             for path in _text_files(folder)
             for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if LAB_NOTE.search(line)]
    assert not found, "a date or a CPU name (move the figure to docs/PERFORMANCE.md with its command):\n" + \
        "\n".join(found)


def test_torchrl_ext_cites_no_doc_of_this_repository():
    """torchrl_ext/ is written to be sent upstream: it cannot point to our docs."""
    found = [f"{path.relative_to(REPO_ROOT)}:{number}"
             for path in _text_files("torchrl_ext")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"docs/|README|PERFORMANCE\.md|LEARNING\.md", line)]
    assert not found, found
