"""``make package-test``: the bundle as a person meets it, on this machine, with no Python on PATH.

Unpacks the newest ``dist/brisk-*.tar.gz`` into a fresh folder and, with an empty environment (``PATH``
pointing nowhere, a new ``HOME`` and data folder), checks: ``brisk --version`` names the version, commit
and build date; ``brisk ask`` answers one question headless on the bundled model (the first start on an
empty data folder, timed); ``brisk doctor`` says which prebuilt native step variant this CPU got, and the
generic variant loads when it is the only one allowed; the window opens offscreen and loads the model
(``BRISK_SMOKE_SHOT``: a screenshot once loaded); ``install.sh`` installs a working ``brisk``.  Prints one
line per check and writes ``build/package-test.json``; exits 1 on the first failure.  ``brisk -c CODE`` runs
code as ``python -c`` (Brisk's own children, such as the quantization probe, start that way).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    tarballs = sorted((ROOT / "dist").glob("brisk-*.tar.gz"), key=lambda p: p.stat().st_mtime)
    if not tarballs:
        print("no dist/brisk-*.tar.gz: run `make package` first", file=sys.stderr)
        return 1
    tarball = tarballs[-1]
    results: dict[str, object] = {"tarball": tarball.name, "tarball_bytes": tarball.stat().st_size}
    with tempfile.TemporaryDirectory(prefix="brisk-package-test-") as tmp:
        root = Path(tmp)
        began = time.perf_counter()
        with tarfile.open(tarball) as tar:
            tar.extractall(root / "unpacked", filter="tar")
        results["unpack_s"] = round(time.perf_counter() - began, 1)
        app = root / "unpacked" / "brisk" / "brisk"
        env = {
            "PATH": str(root / "no-bin"),  # no python, no compiler: nothing at all
            "HOME": str(root / "home"),
            "BRISK_DATA_DIR": str(root / "data"),
            "HF_HUB_OFFLINE": "1",
            "LANG": "C.UTF-8",
        }

        def run(*args: str, extra: dict[str, str] | None = None, timeout: float = 900) -> tuple[str, float]:
            started = time.perf_counter()
            done = subprocess.run(
                [str(app), *args], env={**env, **(extra or {})}, capture_output=True, text=True, timeout=timeout
            )
            took = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"FAILED: brisk {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
            return done.stdout, took

        out, took = run("--version")
        assert "Brisk" in out and "commit" in out and "built" in out, out
        results["version"] = out.strip()
        print(f"ok  --version: {out.strip()} ({took:.1f} s)")

        out, _ = run("-c", "import sys, torch; print('child', sys.argv[1:], torch.__version__)", "x")
        assert out.startswith("child ['x']"), out  # `sys.executable -c` children (the quantization probe)
        print(f"ok  brisk -c runs code as python -c does: {out.strip()}")

        out, took = run("ask", "What is the capital of France?", "--json", "--max-tokens", "24")
        done = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        final = [e for e in done if e.get("type") == "done"]
        assert final and final[0]["text"].strip(), out[-2000:]
        results["first_ask_s"] = round(took, 1)
        results["first_answer"] = final[0]["text"]
        print(f"ok  first ask on an empty data folder: {took:.1f} s, answered {final[0]['text'][:60]!r}")
        out, took = run("ask", "What is the capital of Spain?", "--json", "--max-tokens", "24")
        results["second_ask_s"] = round(took, 1)
        print(f"ok  second ask: {took:.1f} s")

        out, _ = run("doctor", "--json")
        step = json.loads(out)["native decode step"]
        assert "prebuilt" in step and "variant" in step, step
        results["native_variant"] = step
        print(f"ok  native step: {step}")
        out, _ = run("doctor", "--json", extra={"BRISK_NATIVE_VARIANT": "generic"})
        generic = json.loads(out)["native decode step"]
        assert "prebuilt generic variant" in generic, generic
        print(f"ok  generic variant alone: {generic}")

        (ROOT / "build").mkdir(exist_ok=True)
        shot = ROOT / "build" / "package-window.png"
        shot.unlink(missing_ok=True)
        window = {"QT_QPA_PLATFORM": "offscreen", "BRISK_SMOKE_SHOT": str(shot), "BRISK_DATA_DIR": str(root / "fresh")}
        out, took = run(extra=window, timeout=900)  # the window first, on a data folder of its own: a first start
        assert "smoke: Loaded" in out and shot.is_file() and shot.stat().st_size > 10_000, out
        results["window_first_start_s"] = round(took, 1)
        print(f"ok  window on an empty data folder opened offscreen and loaded the model: {took:.1f} s ({shot})")
        out, took = run(extra=window, timeout=900)
        results["window_second_start_s"] = round(took, 1)
        print(f"ok  window again on that folder: {took:.1f} s")

        prefix = root / "prefix"
        install = subprocess.run(
            ["/bin/sh", str(root / "unpacked" / "install.sh")],
            env={**env, "PATH": "/usr/bin:/bin", "PREFIX": str(prefix)},
            capture_output=True,
            text=True,
        )
        assert install.returncode == 0, install.stderr
        command = [str(prefix / "bin" / "brisk"), "--version"]
        installed = subprocess.run(command, env=env, capture_output=True, text=True)
        assert installed.returncode == 0 and "Brisk" in installed.stdout, installed.stderr
        assert (prefix / "share" / "applications" / "brisk.desktop").is_file()
        print(f"ok  install.sh: {prefix / 'bin' / 'brisk'} runs")
    (ROOT / "build" / "package-test.json").write_text(json.dumps(results, indent=2))
    print(f"all checks passed; {ROOT / 'build' / 'package-test.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
