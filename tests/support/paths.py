"""Where the checkout's files are, for tests that read or run them."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
SCRIPTS = REPO_ROOT / "scripts"
BENCHMARKS = REPO_ROOT / "benchmarks"
