"""README.md against the code: what a reader is told exists, exists.

Checked mechanically: the Layout section names every module of every package
(and no module that is gone), every dotted config key the README mentions is a
real key, and the resume allow-list it states is the code's.
"""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from dreamer.config import ALGO_CONFIGS, Config, config_key
from dreamer.run.resume import RESUME_OVERRIDABLE
from tests.support.paths import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
PACKAGES = sorted(p.parent.name for p in (REPO_ROOT / "dreamer").glob("*/__init__.py"))


def _section(title: str) -> str:
    start = README.index(title)
    following = re.search(r"\n#{2,3} ", README[start + len(title):])
    return README[start: start + len(title) + (following.start() if following else len(README))]


def _layout_bullet(package: str) -> str:
    layout = _section("## Layout")
    match = re.search(rf"^- `dreamer/{package}/`(.*?)(?=^- |\Z)", layout, re.S | re.M)
    assert match, f"README Layout has no bullet for dreamer/{package}/"
    return match.group(1)


@pytest.mark.parametrize("package", PACKAGES)
def test_the_layout_names_every_module_of_each_package(package):
    bullet = _layout_bullet(package)
    named = set(re.findall(r"`([a-z_0-9]+)`", bullet))
    directory = REPO_ROOT / "dreamer" / package
    modules = {p.stem for p in directory.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name + "/" for p in directory.iterdir() if (p / "__init__.py").is_file()}
    missing = {m for m in modules if m.rstrip("/") not in named and m not in bullet}
    assert not missing, f"README Layout, dreamer/{package}/: add {sorted(missing)}"
    nested = {p.stem for p in directory.glob("*/*.py") if p.stem != "__init__"}  # v1/models.py, ...
    gone = {n for n in named if n not in {m.rstrip("/") for m in modules} | nested}
    # Backticked words in a bullet are module names, except a few inline code words.
    gone -= {"python", "train", "BaseLearner", "ActingPolicy", "MUJOCO_GL", "Every", "Ratio", "Run", "RunResult"}
    assert not gone, f"README Layout, dreamer/{package}/ names modules that do not exist: {sorted(gone)}"


def _config_keys() -> set[str]:
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


def test_every_config_key_the_readme_mentions_exists():
    keys = _config_keys()
    mentioned = {m for m in re.findall(r"(?<![\w./-])([a-z_]+\.[a-z_][a-z_0-9.]*)(?==|`|\s|,|\))", README)
                 if m.split(".")[0] in SECTIONS and not m.endswith(".")}
    files = ("*", ".py", ".yaml", ".json", ".jsonl", ".pt", ".csv", ".png")
    mentioned = {m for m in mentioned if not m.endswith(files)}
    assert mentioned, "found no config key in the README: the pattern is broken"
    unknown = sorted(m for m in mentioned if m not in keys and not any(k.startswith(m + ".") for k in keys))
    assert not unknown, f"README mentions config keys that do not exist: {unknown}"


def test_the_resume_allow_list_in_the_readme_is_the_codes():
    resume = _section("### Resume")
    sentence = resume[resume.index("Only "): resume.index("may be\nchanged on resume")]
    stated = {word.removesuffix(".*") for word in re.findall(r"`([a-z_.*]+)`", sentence)}
    code = set(RESUME_OVERRIDABLE) - {"resume"}
    assert stated == code, f"README says {sorted(stated - code)} extra, {sorted(code - stated)} missing"
