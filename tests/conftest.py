"""Shared test set-up: offscreen Qt, a private data folder, the tiny and bundled models and engines on them.

``brisk_data_dir`` gives one test a data folder of its own; the GUI harness lives in ``tests/app/conftest.py``;
helpers that tests import live in ``tests/support/``.
"""

from __future__ import annotations

import atexit
import inspect
import json
import os
import re
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

# Tiers (``make test-fast`` runs what none of hostile, cli, bundled and slow marks): marks given here by rule.
# A test that starts the real CLI in a child process says so in its own code (tests/support/brisk_cli.py).
CHILD_CLI = re.compile(r"child=True|\[\*BRISK\b|\"app\.cli\"")  # brisk(..., child=True), [*BRISK, ...]
_STARTS_CHILD: dict[object, bool] = {}
_CHILD_HELPERS: dict[str, re.Pattern[str] | None] = {}


def _helpers(module: object) -> re.Pattern[str] | None:
    """A pattern for the calls of this module's own functions and classes that start the CLI as a child."""
    name = getattr(module, "__name__", "")
    if name not in _CHILD_HELPERS:
        found = []
        for helper, value in vars(module).items():
            if (inspect.isfunction(value) or inspect.isclass(value)) and getattr(value, "__module__", "") == name:
                try:
                    if CHILD_CLI.search(inspect.getsource(value)):
                        found.append(re.escape(helper))
                except (OSError, TypeError):
                    pass
        _CHILD_HELPERS[name] = re.compile(rf"\b(?:{'|'.join(found)})\(") if found else None
    return _CHILD_HELPERS[name]


def _starts_child(item: pytest.Item) -> bool:
    """The test's own code starts the CLI as a child, or calls a function of its module that does."""
    function = getattr(item, "function", None)
    if function is None:
        return False
    if function not in _STARTS_CHILD:
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            source = ""
        helpers = _helpers(inspect.getmodule(function))
        _STARTS_CHILD[function] = bool(CHILD_CLI.search(source) or (helpers and helpers.search(source)))
    return _STARTS_CHILD[function]


# ``slow``: a test that took SLOW_S or more (set-up, call and tear-down) when the durations were last recorded
# (``make test-durations`` writes DURATIONS from a quiet run of the in-process tests).  The fast tier leaves
# them to ``make test``'s second run, so the inner loop's time is kept by measurement, not by memory.
DURATIONS = Path(__file__).with_name("durations.json")
SLOW_S = 2.0
RECORD_MIN_S = 0.5  # shorter tests are not kept in the file
_took: dict[str, float] = {}


def recorded_durations(path: Path | None = None) -> dict[str, float]:
    """The seconds each test took when last recorded ({} without a readable file: no test is ``slow``)."""
    try:
        seconds = json.loads((path or DURATIONS).read_text(encoding="utf-8")).get("seconds", {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(seconds, dict):
        return {}
    return {k: float(v) for k, v in seconds.items() if isinstance(k, str) and isinstance(v, int | float)}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("BRISK_RECORD_DURATIONS"):
        _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ``BRISK_RECORD_DURATIONS=1``: the tests this run ran replace their entries in DURATIONS."""
    if not os.environ.get("BRISK_RECORD_DURATIONS") or not _took:
        return
    kept = {k: v for k, v in recorded_durations().items() if k not in _took}
    kept |= {k: round(v, 2) for k, v in _took.items() if v >= RECORD_MIN_S}
    body = {"note": "written by `make test-durations`; tests/conftest.py marks those of SLOW_S or more slow"}
    body["seconds"] = dict(sorted(kept.items(), key=lambda kv: -kv[1]))
    DURATIONS.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``hostile``: tests/hostile/; ``cli``: a test that starts ``brisk`` in a child process; ``bundled``: a
    test on the bundled SmolLM2 model (its engine, or marked so by hand); ``build``: a test that needs the
    native decode step built (it asks for ``native_step``); ``slow``: one that took SLOW_S s or more when
    the durations were last recorded."""
    took = recorded_durations()
    for item in items:
        if took.get(item.nodeid, 0.0) >= SLOW_S:
            item.add_marker(pytest.mark.slow)
        names = getattr(item, "fixturenames", ())
        if "hostile" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.hostile)
        if _starts_child(item):
            item.add_marker(pytest.mark.cli)
        if "bundled_engine" in names:
            item.add_marker(pytest.mark.bundled)
        if "native_step" in names:
            item.add_marker(pytest.mark.build)


@pytest.fixture(scope="session")
def native_step() -> None:
    """The native decode step, loaded before the test starts (built by ``make``, or here once: about 30 s), so
    fp16-cpu, q8-cpu and GGUF layers decode with it from their first step.  Only tests that need it ask for it
    (they are marked ``build``); elsewhere a first call starts the build in the background."""
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
