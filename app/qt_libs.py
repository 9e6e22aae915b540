"""Qt's system libraries: which ones the window's platform plugin needs and this machine lacks, and the one
``apt-get`` or ``dnf`` line that installs them.

PySide6's wheels bring Qt but not the X libraries its ``xcb`` platform plugin links against
(``libxcb-cursor0``, ``libxcb-icccm4``, ...).  On a minimal Linux the window then fails to open, and Qt's
message names only ``libxcb-cursor0`` whatever is missing.  :func:`check` runs ``ldd`` on the plugin that
Qt will load (found in PySide6's ``Qt/plugins/platforms`` folder without importing Qt, so this module is
cheap and safe to run before Qt fails) and lists each library it reports "not found"; without ``ldd`` it
loads the plugin with :mod:`ctypes`, which names the first missing one.  :func:`install_line` maps those
library names to package names for Debian/Ubuntu (the library's name and version, as Debian names
packages, with a few known exceptions) and Fedora (a table, else dnf's ``'libX.so.N()(64bit)'`` provides),
choosing by ``/etc/os-release``.

Nothing is checked off Linux, when ``QT_QPA_PLATFORM`` names a platform that needs no display libraries
(``offscreen``, ``minimal``, ...), or in a Wayland session whose wayland plugin has everything it needs
(Qt uses that one there).  ``python -m app.qt_libs`` (``make run``) prints the problem and exits 1;
``brisk doctor`` shows :func:`doctor_line`.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

Ldd = Callable[[Path], str | None]  # a plugin -> ldd's output, or None when ldd cannot run

# platforms that draw without any display server's libraries (Qt's own plugins)
HEADLESS = ("offscreen", "minimal", "minimalegl", "vnc", "linuxfb", "eglfs", "vkkhrdisplay")
# brisk's commands that open no window (engine.cli's subcommands; not imported: it is slow to import)
HEADLESS_COMMANDS = {"ask", "chat", "compare", "serve", "documents", "models", "doctor", "bench"}
NO_WINDOW = HEADLESS_COMMANDS | {"--version", "--help", "-h"}
NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)
CANNOT_OPEN = re.compile(r"(\S+\.so[.\d]*): cannot open shared object file")
SONAME = re.compile(r"^(lib.+?)\.so\.([\d.]+)$")

# Debian/Ubuntu packages whose names do not follow "libname + version" (Debian policy's rule)
DEBIAN = {
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libgobject-2.0.so.0": "libglib2.0-0",
    "libz.so.1": "zlib1g",
    "libGLdispatch.so.0": "libglvnd0",
    "libbrotlidec.so.1": "libbrotli1",
    "libbrotlicommon.so.1": "libbrotli1",
    "libgcc_s.so.1": "libgcc-s1",
    "libc.so.6": "libc6",
    "libm.so.6": "libc6",
    "libdl.so.2": "libc6",
    "libpthread.so.0": "libc6",
}

# Fedora packages; a library not named here is asked for by what it provides: 'libX.so.N()(64bit)'
FEDORA = {
    "libxcb-cursor.so.0": "xcb-util-cursor",
    "libxcb-icccm.so.4": "xcb-util-wm",
    "libxcb-ewmh.so.2": "xcb-util-wm",
    "libxcb-keysyms.so.1": "xcb-util-keysyms",
    "libxcb-image.so.0": "xcb-util-image",
    "libxcb-render-util.so.0": "xcb-util-renderutil",
    "libxcb-util.so.1": "xcb-util",
    "libX11-xcb.so.1": "libX11-xcb",
    "libX11.so.6": "libX11",
    "libxkbcommon.so.0": "libxkbcommon",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11",
    "libGL.so.1": "libglvnd-glx",
    "libGLX.so.0": "libglvnd-glx",
    "libEGL.so.1": "libglvnd-egl",
    "libOpenGL.so.0": "libglvnd-opengl",
    "libGLdispatch.so.0": "libglvnd",
    "libfontconfig.so.1": "fontconfig",
    "libfreetype.so.6": "freetype",
    "libglib-2.0.so.0": "glib2",
    "libgthread-2.0.so.0": "glib2",
    "libdbus-1.so.3": "dbus-libs",
    "libSM.so.6": "libSM",
    "libICE.so.6": "libICE",
    "libwayland-client.so.0": "libwayland-client",
    "libwayland-cursor.so.0": "libwayland-cursor",
    "libwayland-egl.so.1": "libwayland-egl",
}


@dataclass(frozen=True)
class Check:
    """What :func:`check` found: the plugin checked and the libraries it lacks, or why nothing was checked."""

    platform: str = ""  # "xcb" or "wayland"; "" when skipped
    missing: tuple[str, ...] = ()
    skipped: str = ""  # why nothing was checked ("" when something was)

    @property
    def ok(self) -> bool:
        return not self.missing


def plugins_folder() -> Path | None:
    """PySide6's ``Qt/plugins/platforms`` folder, found without importing Qt (None: PySide6 is not here)."""
    try:
        spec = importlib.util.find_spec("PySide6")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(root) / "Qt" / "plugins" / "platforms"
        if folder.is_dir():
            return folder
    return None


def run_ldd(plugin: Path) -> str | None:
    """``ldd``'s report on ``plugin``; None when there is no ``ldd`` or it could not run."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    try:
        done = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout + done.stderr


def missing_libraries(plugin: Path, ldd: Ldd | None = None) -> tuple[str, ...]:
    """The libraries ``plugin`` needs that cannot be found here, each once, in ``ldd``'s order.

    Without ``ldd`` the plugin is loaded with ctypes: the loader names the first library it lacks."""
    report = (ldd or run_ldd)(plugin)
    if report is not None:
        return tuple(dict.fromkeys(NOT_FOUND.findall(report)))
    try:
        ctypes.CDLL(str(plugin))
    except OSError as exc:
        found = CANNOT_OPEN.search(str(exc))
        return (found.group(1),) if found else ()
    return ()


def _plugin(folder: Path, name: str) -> Path | None:
    hits = sorted(folder.glob(f"libq{name}*.so"))
    return hits[0] if hits else None


def check(
    environ: Mapping[str, str] | None = None,
    folder: Path | None = None,
    ldd: Ldd | None = None,
    platform: str | None = None,
) -> Check:
    """Which libraries the platform plugin Qt will use here lacks (see the module's docstring for the skips)."""
    env = os.environ if environ is None else environ
    platform = platform or sys.platform
    if not platform.startswith("linux"):
        return Check(skipped=f"not Linux ({platform})")
    chosen = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0].strip().lower()
    if chosen in HEADLESS:
        return Check(skipped=f"QT_QPA_PLATFORM={chosen} needs no display libraries")
    folder = folder or plugins_folder()
    if folder is None:
        return Check(skipped="PySide6's platform plugins were not found")
    wayland_session = bool(env.get("WAYLAND_DISPLAY")) or env.get("XDG_SESSION_TYPE", "").lower() == "wayland"
    if chosen.startswith("wayland") or (not chosen and wayland_session):
        wayland = _plugin(folder, "wayland")
        if wayland is not None:
            lacking = missing_libraries(wayland, ldd)
            if not lacking or chosen:  # an explicit wayland is all Qt tries; a session's falls back to xcb
                return Check("wayland", lacking)
    xcb = _plugin(folder, "xcb")
    if xcb is None:
        return Check(skipped="PySide6 has no xcb platform plugin")
    return Check("xcb", missing_libraries(xcb, ldd))


def read_os_release(path: Path = Path("/etc/os-release")) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def package_manager(os_release: str) -> str:
    """The manager: "apt-get" for Debian, Ubuntu and their kin; "dnf" for Fedora, RHEL, CentOS, ...; "" for others."""
    values = dict(re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', os_release, re.MULTILINE))
    ids = {values.get("ID", "").lower(), *values.get("ID_LIKE", "").lower().split()}
    if ids & {"debian", "ubuntu"}:
        return "apt-get"
    if ids & {"fedora", "rhel", "centos"}:
        return "dnf"
    return ""


def debian_package(soname: str) -> str:
    """Debian's package for a library: ``libxcb-icccm.so.4`` -> ``libxcb-icccm4`` (a name that ends in a
    digit takes a hyphen: ``libxkbcommon-x11.so.0`` -> ``libxkbcommon-x11-0``)."""
    if soname in DEBIAN:
        return DEBIAN[soname]
    found = SONAME.match(soname)
    if found is None:
        return soname
    name, version = found.group(1).lower(), found.group(2).split(".")[0]
    return f"{name}-{version}" if name[-1].isdigit() else f"{name}{version}"


def fedora_package(soname: str) -> str:
    if soname in FEDORA:
        return FEDORA[soname]
    if soname.startswith("libxcb"):
        return "libxcb"  # libxcb.so.1 and every extension library (randr, shape, xkb, ...) but the utils above
    return f"'{soname}()(64bit)'"


def install_line(missing: tuple[str, ...] | list[str], os_release: str) -> str:
    """The one command that installs ``missing`` here (both commands, labelled, when the system is neither)."""
    apt = "sudo apt-get install " + " ".join(dict.fromkeys(debian_package(s) for s in missing))
    dnf = "sudo dnf install " + " ".join(dict.fromkeys(fedora_package(s) for s in missing))
    manager = package_manager(os_release)
    if manager == "apt-get":
        return apt
    if manager == "dnf":
        return dnf
    return f"Debian/Ubuntu: {apt}   Fedora: {dnf}"


def problem(result: Check, os_release: str) -> str | None:
    """What to tell a user when the window cannot open for want of libraries, or None."""
    if result.ok:
        return None
    return (
        f"Qt's {result.platform} platform plugin needs libraries this system lacks "
        f"({', '.join(result.missing)}), so the window cannot open. Install them with:\n"
        f"  {install_line(result.missing, os_release)}"
    )


def doctor_line(result: Check | None = None, os_release: str | None = None) -> str:
    """One line for ``brisk doctor``: the libraries are there, which are missing and the command, or the skip."""
    result = check() if result is None else result
    if result.skipped:
        return f"not checked: {result.skipped}"
    if result.ok:
        return f"ok (the {result.platform} plugin finds every library it needs)"
    os_release = read_os_release() if os_release is None else os_release
    return f"missing {', '.join(result.missing)}; install with: {install_line(result.missing, os_release)}"


def main(argv: list[str] | None = None) -> int:
    """``python -m app.qt_libs [brisk's arguments]``: exit 1 with the command that installs what is missing, else
    0 quietly.  Arguments that name a headless command (``make run ARGS="ask Hi"``) skip the check."""
    if set(sys.argv[1:] if argv is None else argv) & NO_WINDOW:
        return 0
    said = problem(check(), read_os_release())
    if said:
        print(f"brisk: {said}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
