"""Qt's system libraries (issue 50): which ones the window's platform plugin lacks, and the one line that installs
them on Debian/Ubuntu or Fedora; `make run` and `brisk doctor` say it.  No Qt is imported: the plugin folders are
real folders with stand-in plugins, and ldd's report is the text ldd prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app import qt_libs
from app.qt_libs import Check, check, doctor_line, install_line, problem

DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
UBUNTU = 'NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\n'
MINT = 'NAME="Linux Mint"\nID=linuxmint\nID_LIKE="ubuntu debian"\n'
FEDORA = 'NAME="Fedora Linux"\nID=fedora\n'
ROCKY = 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'

# what ldd prints for PySide6 6.x's libqxcb.so on a minimal Debian (cut short)
LDD_XCB = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/plugins/platforms/../../lib/libQt6XcbQpa.so.6 (0x00007f29)
\tlibxcb-cursor.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibxcb-util.so.1 => /lib/x86_64-linux-gnu/libxcb-util.so.1 (0x00007f29)
\tlibxcb-keysyms.so.1 => not found
\tlibxkbcommon-x11.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f29)
"""
LDD_ALL_THERE = "\tlibxcb.so.1 => /lib/x86_64-linux-gnu/libxcb.so.1 (0x00007f29)\n"


@pytest.fixture
def plugins(tmp_path: Path) -> Path:
    """A platforms folder as PySide6 ships it (the files stand in for the plugins: only ldd reads them here)."""
    for name in ("libqxcb.so", "libqwayland.so", "libqoffscreen.so", "libqminimal.so"):
        (tmp_path / name).write_bytes(b"\x7fELF")
    return tmp_path


def ldd_saying(reports: dict[str, str]):  # noqa: ANN201
    return lambda plugin: reports[plugin.name]


def test_the_missing_libraries_are_named_with_the_packages_that_hold_them(plugins: Path) -> None:
    found = check({"DISPLAY": ":0"}, plugins, ldd_saying({"libqxcb.so": LDD_XCB}), "linux")
    missing = ("libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxkbcommon-x11.so.0")
    assert found == Check("xcb", missing), "each missing library once, in ldd's order"
    apt = "sudo apt-get install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0"
    dnf = "sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms libxkbcommon-x11"
    for os_release in (DEBIAN, UBUNTU, MINT):
        said = problem(found, os_release)
        assert said is not None and said.splitlines()[-1].strip() == apt
        assert "libxcb-icccm.so.4" in said.splitlines()[0], "names what is missing, not only libxcb-cursor0"
    for os_release in (FEDORA, ROCKY):
        said = problem(found, os_release)
        assert said is not None and said.splitlines()[-1].strip() == dnf
    both = install_line(missing, "ID=arch\n")
    assert apt in both and dnf in both, "another system gets both lines"
    assert doctor_line(found, DEBIAN) == f"missing {', '.join(missing)}; install with: {apt}"


def test_package_names_follow_each_distribution() -> None:
    assert qt_libs.debian_package("libxcb-render-util.so.0") == "libxcb-render-util0"
    assert qt_libs.debian_package("libX11-xcb.so.1") == "libx11-xcb1"
    assert qt_libs.debian_package("libdbus-1.so.3") == "libdbus-1-3"
    assert qt_libs.debian_package("libglib-2.0.so.0") == "libglib2.0-0"
    assert qt_libs.fedora_package("libxcb-randr.so.0") == "libxcb"
    assert qt_libs.fedora_package("libxcb-render-util.so.0") == "xcb-util-renderutil"
    assert qt_libs.fedora_package("libunheard.so.7") == "'libunheard.so.7()(64bit)'", "dnf finds it by what it provides"


def test_nothing_is_checked_where_no_x_libraries_are_needed(plugins: Path) -> None:
    broken = ldd_saying({"libqxcb.so": LDD_XCB, "libqwayland.so": LDD_ALL_THERE})
    for platform in ("offscreen", "minimal", "vnc:size=800x600"):
        found = check({"QT_QPA_PLATFORM": platform}, plugins, broken, "linux")
        assert found.ok and found.skipped and problem(found, DEBIAN) is None
    assert check({}, plugins, broken, "darwin").skipped
    wayland = check({"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"}, plugins, broken, "linux")
    assert wayland == Check("wayland", ()), "a Wayland session whose wayland plugin loads needs no xcb"
    # the session's wayland plugin lacks a library: Qt falls back to xcb, so that is what must load
    lacking = ldd_saying({"libqxcb.so": LDD_XCB, "libqwayland.so": "\tlibwayland-cursor.so.0 => not found\n"})
    assert check({"WAYLAND_DISPLAY": "wayland-0"}, plugins, lacking, "linux").platform == "xcb"
    assert check({"QT_QPA_PLATFORM": "wayland"}, plugins, lacking, "linux").missing == ("libwayland-cursor.so.0",)
    assert check({"DISPLAY": ":0"}, plugins, ldd_saying({"libqxcb.so": LDD_ALL_THERE}), "linux") == Check("xcb")


def test_make_run_stops_with_the_line_and_headless_commands_go_on(
    plugins: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(qt_libs, "plugins_folder", lambda: plugins)
    monkeypatch.setattr(qt_libs, "run_ldd", ldd_saying({"libqxcb.so": LDD_XCB}))
    monkeypatch.setattr(qt_libs, "read_os_release", lambda: FEDORA)
    assert qt_libs.main(["--model", "x"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("brisk: Qt's xcb platform plugin") and "sudo dnf install xcb-util-cursor" in said
    assert qt_libs.main(["ask", "Hi"]) == 0 and capsys.readouterr().err == ""


def test_the_headless_commands_are_brisks() -> None:
    from engine.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == qt_libs.HEADLESS_COMMANDS  # type: ignore[arg-type]


def test_brisk_doctor_says_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import engine.doctor
    from app.cli import main

    monkeypatch.setattr(engine.doctor, "report", lambda: {"python": "3"})  # the engine's slow probes are not ours
    monkeypatch.setattr(qt_libs, "doctor_line", lambda: "missing libxcb-icccm.so.4; install with: sudo apt-get ...")
    assert main(["doctor"]) == 0
    assert "qt libraries: missing libxcb-icccm.so.4; install with: sudo apt-get" in capsys.readouterr().out


def test_on_this_machine_ldd_and_the_loader_agree() -> None:
    """The real plugin, two ways: what ldd reports missing is what the dynamic loader refuses to load."""
    folder = qt_libs.plugins_folder()
    assert folder is not None and (folder / "libqxcb.so").is_file()
    found = check({"DISPLAY": ":0"}, folder, platform="linux")
    assert found.platform == "xcb" and not found.skipped
    code = f"import ctypes; ctypes.CDLL({str(folder / 'libqxcb.so')!r})"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if found.ok:
        assert loaded.returncode == 0, loaded.stderr
    else:
        assert loaded.returncode != 0 and any(name in loaded.stderr for name in found.missing)
        without_ldd = qt_libs.missing_libraries(folder / "libqxcb.so", ldd=lambda _plugin: None)
        assert len(without_ldd) == 1 and without_ldd[0] in found.missing, "ctypes names the first one"
