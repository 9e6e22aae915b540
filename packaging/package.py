"""``make package``: the installable Linux bundle, ``dist/brisk-VERSION-linux-x86_64.tar.gz``.

Steps: the native decode step for three CPU targets (``packaging/build_native.py``), the version, commit and
build date (``app/build_info.json``), PyInstaller over ``packaging/brisk.spec`` (one folder: Python, torch
CPU, PySide6, the bundled model), then one tarball holding that folder (``brisk/``, started by
``brisk/brisk``), ``install.sh`` (puts it in ``~/.local/lib/brisk`` with a ``brisk`` command in
``~/.local/bin``, the desktop entry and the icon), the ``.desktop`` file and the icon.  Prints the sizes.

Why PyInstaller and not Briefcase: PyInstaller bundles this very environment (the torch CPU wheel from
this machine's disk, every package as tested) and has hooks for torch, transformers and PySide6
(``pyinstaller-hooks-contrib``); Briefcase builds its app from a standalone Python it downloads from
GitHub and from package requirements it installs anew, which these machines (package registries only)
cannot fetch, and would pull torch's CUDA build unless told otherwise.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
DIST = ROOT / "dist"


def sh(*command: str, **kwargs: object) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from app.version import commit
    from app.version import version as installed_version

    started = time.perf_counter()
    version = installed_version()
    info = {
        "version": version,
        "commit": commit() or "unknown",
        "built": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    BUILD.mkdir(exist_ok=True)
    build_info = BUILD / "build_info.json"
    build_info.write_text(json.dumps(info))
    native = BUILD / "native"
    shutil.rmtree(native, ignore_errors=True)
    sh(sys.executable, "packaging/build_native.py", str(native))
    env = {**os.environ, "BRISK_NATIVE_OUT": str(native), "BRISK_BUILD_INFO": str(build_info)}
    bundle = BUILD / "bundle"
    sh(
        sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
        "--workpath", str(BUILD / "pyinstaller"), "--distpath", str(bundle), "packaging/brisk.spec", env=env,
    )  # fmt: skip
    folder = bundle / "brisk"
    machine = platform.machine()
    DIST.mkdir(exist_ok=True)
    tarball = DIST / f"brisk-{version}-linux-{machine}.tar.gz"
    with tarfile.open(tarball, "w:gz", compresslevel=6) as tar:
        tar.add(folder, arcname="brisk")
        for name in ("install.sh", "brisk.desktop"):
            tar.add(ROOT / "packaging" / name, arcname=name)
        tar.add(ROOT / "resources" / "brisk.svg", arcname="brisk.svg")
    print(
        f"\nbundle folder {size(folder) / 2**20:.0f} MiB, {tarball.relative_to(ROOT)} {size(tarball) / 2**20:.0f} MiB "
        f"({info['version']}, commit {info['commit']}, built {info['built']}; {time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
