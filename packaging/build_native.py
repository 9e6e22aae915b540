"""Build the native decode step for the bundle: one library per CPU target, and a manifest of their checksums.

``python packaging/build_native.py OUT_DIR`` compiles ``engine/quant/native_step.cpp`` with torch's
``cpp_extension`` three times (``engine.quant.native.VARIANTS``: ``-march=x86-64``, ``haswell`` for AVX2,
``cascadelake`` for AVX-512 with VNNI), test-loads in a child process each variant this CPU can run,
and writes ``OUT_DIR/variants.json`` (file, module name, sha256, the torch version).  At run time the
bundle loads the widest variant the user's CPU runs (``engine.quant.native._load_prebuilt``), checked
against that sha256 first; none fits: the eager path decodes.  No compiler is needed where it runs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    import torch

    from engine.quant.native import MANIFEST, SOURCES, VARIANTS, _cpu_flags

    out = Path(argv[0]) if argv else ROOT / "build" / "native"
    out.mkdir(parents=True, exist_ok=True)
    flags = set(_cpu_flags().split())
    entries = {}
    for variant, needs, march in VARIANTS:
        name = f"brisk_step_{variant}"
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"brisk-native-{variant}-") as build:
            cflags = ["-O3", f"-march={march}", "-mtune=generic", "-fopenmp"]
            # built in a child that also loads it (torch's load does): where this CPU lacks the variant's
            # instructions that load may fail, after the library is written; only the file is wanted
            code = (
                "from torch.utils.cpp_extension import load; "
                f"load(name={name!r}, sources={[str(s) for s in SOURCES]!r}, extra_cflags={cflags!r}, "
                f"extra_ldflags=['-fopenmp'], build_directory={build!r}, verbose=False)"
            )
            subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT)
            so = Path(build) / f"{name}.so"
            if not so.is_file():
                print(f"{variant}: not built", file=sys.stderr)
                continue
            shutil.copy2(so, out / so.name)
        runs_here = set(needs) <= flags
        if runs_here:
            check = (
                "import importlib.util as u, sys; s = u.spec_from_file_location(sys.argv[1], sys.argv[2]); "
                "m = u.module_from_spec(s); s.loader.exec_module(m); assert callable(m.Stepper)"
            )
            subprocess.run([sys.executable, "-c", "import torch; " + check, name, str(out / so.name)], check=True)
        digest = hashlib.sha256((out / so.name).read_bytes()).hexdigest()
        entries[variant] = {"file": so.name, "name": name, "sha256": digest, "march": march}
        tested = "test-loaded" if runs_here else "not test-loaded (this CPU lacks it)"
        size = (out / so.name).stat().st_size >> 10
        print(f"{variant}: {so.name} ({size} KiB, {time.perf_counter() - started:.0f} s, {tested})")
    if "generic" not in entries:
        print("the generic variant did not build", file=sys.stderr)
        return 1
    (out / MANIFEST).write_text(json.dumps({"torch": torch.__version__, "variants": entries}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
