"""Warm compile starts: the cache dir setting and the portable artifact file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dreamer.config import CompileConfig
from dreamer.errors import UserError
from dreamer.system import compile_cache

# A tiny function compiled with inductor (C++ on CPU), fresh process each time:
# prints the inductor FX-graph cache hits/misses after one forward+backward.
COMPILE_ONCE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    from dreamer.system import compile_cache
    from torch._dynamo.utils import counters

    artifact, save_dir = sys.argv[1], sys.argv[2]
    if artifact != "-":
        assert compile_cache.load_artifact(Path(artifact))
    f = torch.compile(lambda x, w: torch.tanh(x @ w).sum(), backend="inductor")
    w = torch.randn(8, 4, requires_grad=True)
    f(torch.randn(16, 8), w).backward()
    if save_dir != "-":
        compile_cache.save_artifact(Path(save_dir))
    print(json.dumps(dict(counters["inductor"])))
    """
)


def _compile_in_fresh_process(cache_dir: Path, artifact: str, save_dir: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    out = subprocess.run(
        [sys.executable, "-c", COMPILE_ONCE, artifact, save_dir],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_artifact_carries_compiled_graphs_to_an_empty_cache(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cold = _compile_in_fresh_process(tmp_path / "cache_a", "-", str(run_dir))
    artifact = run_dir / compile_cache.ARTIFACT_NAME
    assert artifact.is_file() and artifact.stat().st_size > 0
    assert cold.get("fxgraph_cache_miss", 0) > 0 and cold.get("fxgraph_cache_hit", 0) == 0

    # Another machine: nothing in its cache dir, only the artifact file.
    warm = _compile_in_fresh_process(tmp_path / "cache_b", str(artifact), "-")
    assert warm.get("fxgraph_cache_hit", 0) > 0
    assert warm.get("fxgraph_cache_miss", 0) == 0


def test_cache_dir_is_created_and_exported(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    target = tmp_path / "nested" / "cache"
    used = compile_cache.use_cache_dir(CompileConfig(cache_dir=str(target)))
    assert Path(used) == target.resolve() and target.is_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(target.resolve())


def test_unwritable_cache_dir_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UserError, match=r"compile.cache_dir=.*writable"):
        compile_cache.use_cache_dir(CompileConfig(cache_dir=str(blocker / "cache")))


def test_missing_explicit_artifact_is_one_clear_error(tmp_path):
    cc = CompileConfig(cache_artifact=str(tmp_path / "nope.bin"))
    with pytest.raises(UserError, match=r"compile.cache_artifact=.*does not exist"):
        compile_cache.artifact_to_load(cc, tmp_path, resumed=False)


def test_a_resumed_run_loads_its_own_artifact_and_a_new_run_does_not(tmp_path):
    own = tmp_path / compile_cache.ARTIFACT_NAME
    own.write_bytes(b"x")
    assert compile_cache.artifact_to_load(CompileConfig(), tmp_path, resumed=True).path == own
    assert compile_cache.artifact_to_load(CompileConfig(), tmp_path, resumed=False) is None


def test_an_unloadable_artifact_warns_and_compiles_cold(tmp_path, caplog):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a cache")
    assert compile_cache.load_artifact(bad) is False
    assert "not loaded" in caplog.text
