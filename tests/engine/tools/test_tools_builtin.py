"""The built-in tools: calculator bounds, clock, units, files inside granted folders only, fetch's address checks."""

from __future__ import annotations

import datetime as dt
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.tools import Call, Registry, ToolError, builtin_tools, run_calls
from engine.tools.calculator import evaluate
from engine.tools.clock import run_clock
from engine.tools.fetch import check_address, fetch
from engine.tools.files import Folders, run_files
from engine.tools.units import convert


def test_calculator_arithmetic() -> None:
    assert evaluate("2*(3+4)") == 14
    assert evaluate("2^10") == 1024
    assert evaluate("7 // 2 + 7 % 2") == 4
    assert evaluate("sqrt(16) + max(1, 2)") == 6.0
    assert abs(evaluate("sin(pi/2)") - 1) < 1e-12


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("9**9**9", "exponent"),
        ("10**5000", "too large"),
        ("2**4000 * 2**4000", "too large"),
        ("1/0", "division by zero"),
        ("__import__('os').system('true')", "only arithmetic"),
        ("(1).__class__", "only arithmetic"),
        ("open('x')", "only arithmetic"),
        ("[1, 2]", "only arithmetic"),
        ("x", "only arithmetic"),
        ("1 +", "not an arithmetic expression"),
        ("1+" * 400 + "1", "characters long"),
        ("10.0 ** 400", "too large"),
    ],
)
def test_calculator_refuses(expression: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        evaluate(expression)


def test_clock_now_zone_and_arithmetic() -> None:
    fixed = dt.datetime(2025, 3, 8, 17, 0, tzinfo=dt.UTC)
    assert "2025-03-09 02:00:00 JST (UTC+09:00)" in run_clock({"zone": "Asia/Tokyo"}, now=lambda: fixed)
    text = run_clock({"date": "2025-03-08T12:00", "zone": "America/New_York", "add_days": 1, "until": "2025-03-10"})
    assert "2025-03-09 12:00:00 EDT" in text  # the same wall-clock hour across the DST change
    assert "0 days 12 h 0 min" in text
    with pytest.raises(ToolError, match="unknown time zone"):
        run_clock({"zone": "Mars/Olympus"})
    with pytest.raises(ToolError, match="ISO 8601"):
        run_clock({"date": "next tuesday"})


def test_units_through_pint() -> None:
    assert convert("3 miles to km").endswith("4.82803 km")
    assert "37.7778" in convert("100 degF", "degC")
    with pytest.raises(ToolError, match="different things"):
        convert("3 m to kg")
    with pytest.raises(ToolError, match="unknown unit"):
        convert("3 blorps to m")


@pytest.fixture
def granted(tmp_path: Path) -> Path:
    root = tmp_path / "granted"
    (root / "sub").mkdir(parents=True)
    (root / "notes.txt").write_text("alpha\nthe Secret word is brisk\n")
    (root / "sub" / "deep.md").write_text("# deep\nbrisk again\n")
    (root / "blob.bin").write_bytes(b"\x00\x01binary")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "private.txt").write_text("brisk private data\n")
    os.symlink(outside / "private.txt", root / "link_to_private.txt")
    os.symlink(outside, root / "link_dir")
    return root


def test_files_reads_lists_and_searches_inside(granted: Path) -> None:
    folders = Folders([granted])
    assert "Secret word" in run_files(folders, {"path": "notes.txt"})
    assert "deep.md" in run_files(folders, {"path": "sub"})
    assert "brisk again" in run_files(folders, {"path": str(granted / "sub" / "deep.md")})  # absolute, inside
    found = run_files(folders, {"search": "BRISK"})
    assert "granted/notes.txt:2:" in found and "granted/sub/deep.md:2:" in found
    assert "private" not in found  # the symlinks out were not followed
    with pytest.raises(ToolError, match="not a text file"):
        run_files(folders, {"path": "blob.bin"})


@pytest.mark.parametrize(
    "path",
    [
        "../outside/private.txt",
        "sub/../../outside/private.txt",
        "link_to_private.txt",
        "link_dir/private.txt",
        "/etc/passwd",
    ],
)
def test_files_refuses_anything_outside(granted: Path, path: str) -> None:
    folders = Folders([granted])
    with pytest.raises(ToolError, match="outside the granted folders"):
        run_files(folders, {"path": path})
    with pytest.raises(ToolError, match="outside the granted folders"):
        run_files(folders, {"path": path, "search": "brisk"})


def test_files_absolute_path_outside_and_nothing_granted(granted: Path) -> None:
    outside = granted.parent / "outside" / "private.txt"
    with pytest.raises(ToolError, match="outside the granted folders"):
        run_files(Folders([granted]), {"path": str(outside)})
    with pytest.raises(ToolError, match="no folder is granted"):
        run_files(Folders([]), {"path": "notes.txt"})


@pytest.mark.parametrize(
    "ip",
    [
        "127.0.0.1",
        "10.0.0.8",
        "192.168.1.1",
        "172.16.0.1",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "0.0.0.0",
    ],
)
def test_fetch_refuses_local_addresses(ip: str) -> None:
    with pytest.raises(ToolError, match="refused"):
        check_address(ip)
    check_address(ip, allow_private=True)
    check_address("93.184.216.34")


@pytest.fixture
def local_server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/page")
                self.end_headers()
                return
            body = (
                b"<html><head><style>p{}</style></head><body><p>Hello <b>tools</b></p>"
                + b"x" * 5000
                + b"</body></html>"
            )
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_loopback_refused_by_default_allowed_when_asked(local_server: str) -> None:
    with pytest.raises(ToolError, match="loopback"):
        fetch(local_server + "/page")
    with pytest.raises(ToolError, match="loopback"):
        fetch(local_server.replace("127.0.0.1", "localhost") + "/page")
    text = fetch(local_server + "/redirect", allow_private=True)
    assert text.startswith("Hello tools") and "p{}" not in text
    assert fetch(local_server + "/page", allow_private=True, max_bytes=100).endswith("[truncated]")
    with pytest.raises(ToolError, match="only http"):
        fetch("file:///etc/passwd", allow_private=True)


def test_builtins_run_through_the_registry(granted: Path) -> None:
    registry = Registry(builtin_tools([granted]), enabled=["calculator", "units", "files", "clock"])
    turn = run_calls(
        [
            Call("calculator", {"expression": "2*(3+4)"}),
            Call("units", {"quantity": "1 km", "to": "m"}),
            Call("files", {"path": "../outside/private.txt"}),
            Call("fetch", {"url": "http://127.0.0.1/"}),
            Call("clock", {"zone": "Europe/Paris"}),
        ],
        registry,
    )
    calc, units, files, fetched, clock = turn.results
    assert (calc.ok, calc.text) == (True, "14")
    assert units.ok and "1000 m" in units.text
    assert not files.ok and "outside" in files.text
    assert not fetched.ok and "not enabled" in fetched.text  # fetch is off unless enabled
    assert clock.ok and "Europe/Paris" not in clock.text and "CE" in clock.text
