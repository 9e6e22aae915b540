"""Shared test set-up: offscreen Qt, a private data folder, the tiny and bundled models and engines on them.

``brisk_data_dir`` gives one test a data folder of its own; the GUI harness lives in ``tests/app/conftest.py``;
helpers that tests import live in ``tests/support/``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One data folder per test session, so the bundled model is converted once per run; removed when the run ends
# (it holds converted and quantized models: about 2 GB a run, which filled the disk after 200 runs).
os.environ["BRISK_DATA_DIR"] = tempfile.mkdtemp(prefix="brisk-test-")
atexit.register(shutil.rmtree, os.environ["BRISK_DATA_DIR"], ignore_errors=True)

import pytest  # noqa: E402

from tests.support.engine_runner import EngineRunner  # noqa: E402
from tests.support.tiny import make_tiny_model  # noqa: E402

# Tiers (``make test-fast`` runs what none of these marks): marks given here by rule, not by memory.
CHILD_CLI = ("run_cli(", "brisk_cli", "\"app.cli\"", "BRISK = [")  # a module that starts the real CLI as a child
_CHILD_MODULES: dict[str, bool] = {}


def _starts_cli(path: Path) -> bool:
    if str(path) not in _CHILD_MODULES:
        text = path.read_text(encoding="utf-8", errors="replace")
        _CHILD_MODULES[str(path)] = any(marker in text for marker in CHILD_CLI)
    return _CHILD_MODULES[str(path)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``hostile``: tests/hostile/; ``cli``: a module that starts ``brisk`` in a child process; ``bundled``: a
    test on the bundled SmolLM2 model (its engine, or marked so by hand)."""
    for item in items:
        path = Path(str(item.fspath))
        if "hostile" in path.parts:
            item.add_marker(pytest.mark.hostile)
        if _starts_cli(path):
            item.add_marker(pytest.mark.cli)
        if "bundled_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.bundled)


@pytest.fixture(scope="session", autouse=True)
def native_step() -> None:
    """fp16-cpu decodes with the native step from the first test on (built by ``make``, or here once)."""
    from engine.quant import native

    native.module(wait=True)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_dir: Path):
    runner = EngineRunner(str(tiny_dir))
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def bundled_engine():
    runner = EngineRunner("")
    yield runner
    runner.close()


@pytest.fixture
def brisk_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private data folder for one test (settings.json, brisk.db, presets.json): BRISK_DATA_DIR points at it."""
    data = tmp_path / "brisk-data"
    data.mkdir()
    monkeypatch.setenv("BRISK_DATA_DIR", str(data))
    return data


@pytest.fixture
def library_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, brisk_data_dir: Path) -> Path:
    """An empty HOME for the model library's tests: no other app's models, the hub cache under it
    (``tests/support/model_library.py`` fills it)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / ".cache" / "huggingface" / "hub"))
    for name in ("HF_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "OLLAMA_MODELS", "LOCALAPPDATA"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def empty_hub(library_home: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A fake Hugging Face hub with no repos yet (``tests/support/fake_hub.py``; add them with ``add_repo``):
    HF_ENDPOINT points at it, downloads allowed, into ``library_home``'s hub cache, no retry waits."""
    from huggingface_hub import constants

    from engine.library import pull as pull_module
    from tests.support.fake_hub import FakeHub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # huggingface_hub read the variable when imported
    monkeypatch.setattr(pull_module, "_RETRY_DELAYS", (0.0, 0.0, 0.0))
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub
