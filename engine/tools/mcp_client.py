"""MCP servers as sources of tools, through the official ``mcp`` SDK (2.x).

A :class:`McpHub` owns one background thread running an asyncio loop; every
server's session lives on it, so the synchronous engine thread (and the GUI)
can start servers, list and call their tools.  A server is a command line
(stdio) or a URL (streamable HTTP), described by a :class:`ServerSpec`.

Everything is bounded: starting a server waits at most ``connect_timeout_s``,
a call at most ``call_timeout_s``.  A server that fails to start, hangs or
dies is reported in its :class:`ServerState` (``status`` and a ``message`` that
says what happened and what to do, with the tail of its stderr) and its calls
give error results; nothing here raises into the chat.  :meth:`McpHub.tools`
gives the ready servers' tools as registry :class:`Tool` objects whose
functions are async and run on the hub's loop.

A stdio server speaks through :func:`engine.tools.mcp_stdio.bounded_stdio`:
one message is read up to 4 MB (a larger reply fails its call at once), and
what a server writes on stdout that is not MCP is dropped and counted; when
its session ends, one warning line (logger ``engine.tools.mcp_client``) names
the server and what was dropped, instead of a traceback per line.

The plain values (:class:`ServerSpec`, :class:`ServerState`, :class:`McpTool`,
``STATUSES``) live in :mod:`engine.tools.mcp_spec` and are importable from
here; turning what a server sends back into text (tool lists, call results,
errors, its stderr) is :mod:`engine.tools.mcp_replies`'.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import shlex
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import IO, Any

from engine.tools.mcp_replies import list_tools, result_text, root_cause, stderr_size, stderr_tail
from engine.tools.mcp_spec import STATUSES, McpTool, ServerSpec, ServerState
from engine.tools.mcp_stdio import Strays
from engine.tools.registry import Tool, ToolError

__all__ = ["STATUSES", "McpHub", "McpTool", "ServerSpec", "ServerState"]
log = logging.getLogger(__name__)


@dataclass
class _Server:
    spec: ServerSpec
    state: ServerState
    ready: threading.Event = field(default_factory=threading.Event)
    client: Any = None
    stop: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None
    errlog: IO[str] | None = None
    strays: Strays = field(default_factory=Strays)  # what its stdout held that was not MCP


class McpHub:
    """The MCP servers the user added, with their sessions on one background loop thread."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = 20.0,
        call_timeout_s: float = 30.0,
        on_change: Callable[[ServerState], None] | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.call_timeout_s = call_timeout_s
        self.on_change = on_change  # called on the hub's thread whenever a server's state changes
        self._servers: dict[str, _Server] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- the loop thread ---------------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="mcp-hub", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def _submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())

    # -- servers -----------------------------------------------------------------------------------

    def add(self, spec: ServerSpec, *, wait: bool = True) -> ServerState:
        """Start ``spec`` (replacing a server of that name); with ``wait``, block until ready or failed."""
        self.remove(spec.name)
        server = _Server(spec, ServerState(spec.name, "starting", "starting"))
        with self._lock:
            self._servers[spec.name] = server
        self._submit(self._start(server))
        if wait:
            self.wait_ready(spec.name)
        return server.state

    def wait_ready(self, name: str, timeout_s: float | None = None) -> ServerState:
        """Block until the server is ready or failed (at most the connect timeout plus a margin)."""
        server = self._servers.get(name)
        if server is None:
            return ServerState(name, "stopped", f"no MCP server named {name!r} was added")
        server.ready.wait(timeout_s if timeout_s is not None else self.connect_timeout_s + 10.0)
        return server.state

    def restart(self, name: str, *, wait: bool = True) -> ServerState:
        server = self._servers.get(name)
        if server is None:
            return ServerState(name, "stopped", f"no MCP server named {name!r} was added")
        return self.add(server.spec, wait=wait)

    def remove(self, name: str, timeout_s: float = 10.0) -> None:
        """Stop the server and forget it."""
        with self._lock:
            server = self._servers.pop(name, None)
        if server is not None and self._loop is not None:
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                self._submit(self._stop(server)).result(timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every server and the loop thread."""
        for name in list(self._servers):
            self.remove(name, timeout_s)
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)
            if not thread.is_alive():
                loop.close()

    def states(self) -> list[ServerState]:
        return [s.state for s in list(self._servers.values())]

    def state(self, name: str) -> ServerState | None:
        server = self._servers.get(name)
        return server.state if server else None

    def specs(self) -> list[ServerSpec]:
        return [s.spec for s in list(self._servers.values())]

    # -- tools -------------------------------------------------------------------------------------

    def tools(self, taken: Callable[[str], bool] = lambda name: False) -> list[Tool]:
        """The ready servers' tools; a name that is ``taken`` (or repeated) becomes ``SERVER__NAME``."""
        out: list[Tool] = []
        seen: set[str] = set()
        for server in list(self._servers.values()):
            if server.state.status != "ready":
                continue
            for info in server.state.tools:
                name = info.name
                if name in seen or taken(name) or any(c.isspace() for c in name):
                    name = f"{server.spec.name}__{info.name}".replace(" ", "_")
                seen.add(name)
                out.append(self._tool(server.spec.name, info, name))
        return out

    def _tool(self, server: str, info: McpTool, name: str) -> Tool:
        async def fn(arguments: dict[str, Any]) -> str:
            return await asyncio.wrap_future(self._submit(self._call(server, info.name, arguments)))

        return Tool(
            name=name,
            description=info.description or f"{info.name} (from the MCP server {server})",
            parameters=info.parameters,
            fn=fn,
            timeout_s=self.call_timeout_s + 2.0,
            source=f"mcp:{server}",
        )

    def call(self, server: str, tool: str, arguments: Mapping[str, Any]) -> str:
        """Call ``tool`` on ``server`` from any thread but the hub's; raises :class:`ToolError`."""
        future = self._submit(self._call(server, tool, dict(arguments)))
        try:
            return future.result(self.call_timeout_s + 2.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolError(f"the MCP server {server!r} did not answer {tool} in {self.call_timeout_s:g} s") from None

    # -- on the loop -------------------------------------------------------------------------------

    def _set(self, server: _Server, status: str, message: str = "", tools: tuple[McpTool, ...] = ()) -> None:
        server.state = ServerState(server.spec.name, status, message, tools)
        if status != "starting":
            server.ready.set()
        if self.on_change is not None:
            try:
                self.on_change(server.state)
            except Exception as exc:  # a listener's bug must not stop the server's session
                server.state = replace(server.state, message=f"{server.state.message} (on_change failed: {exc})")

    async def _start(self, server: _Server) -> None:
        server.stop = asyncio.Event()
        server.task = asyncio.ensure_future(self._session(server))

    async def _session(self, server: _Server) -> None:
        from mcp import Client

        try:
            async with asyncio.timeout(self.connect_timeout_s) as deadline:
                client = Client(self._transport(server), read_timeout_seconds=self.call_timeout_s)
                async with contextlib.AsyncExitStack() as stack:
                    await stack.enter_async_context(client)
                    tools = await list_tools(client)
                    deadline.reschedule(None)
                    server.client = client
                    self._set(server, "ready", f"{len(tools)} tools", tools)
                    assert server.stop is not None
                    await server.stop.wait()
        except TimeoutError:
            self._set(server, "failed", self._explain(server, f"did not answer within {self.connect_timeout_s:g} s"))
        except asyncio.CancelledError:
            self._set(server, "stopped", "stopped")
        except BaseException as exc:  # noqa: BLE001 - anyio wraps transport failures in exception groups
            was_ready = server.state.status == "ready"
            what = "stopped working" if was_ready else "could not be started"
            self._set(server, "died" if was_ready else "failed", self._explain(server, f"{what}: {root_cause(exc)}"))
        else:
            if server.state.status == "ready":
                self._set(server, "stopped", "stopped")
        finally:
            server.client = None
            if server.state.status == "starting":
                self._set(server, "failed", self._explain(server, "ended before it was ready"))
            if server.errlog is not None:
                server.errlog.close()
                server.errlog = None
            if server.strays:
                log.warning("%s", self._dropped(server))
                server.strays = Strays()

    def _dropped(self, server: _Server) -> str:
        """One line: which server, what it wrote that was dropped, what to do."""
        spec = server.spec
        where = spec.url or shlex.join(spec.command)
        return (
            f"MCP server {spec.name!r} ({where[:200]}) wrote {server.strays.summary()}; they were dropped. "
            "A server must write only MCP messages on stdout (its logs belong on stderr)."
        )

    def _transport(self, server: _Server) -> Any:
        spec = server.spec
        if spec.url:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(spec.url)
        from mcp import StdioServerParameters

        # closed when the session ends (in _session's finally); the server's stderr goes there for messages
        server.errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        params = StdioServerParameters(
            command=spec.command[0], args=list(spec.command[1:]), env=dict(spec.env or {}) or None, cwd=spec.cwd
        )
        if sys.platform == "win32":  # the SDK's own transport (unbounded) where process groups do not exist
            from mcp.client.stdio import stdio_client

            return stdio_client(params, errlog=server.errlog)
        from engine.tools.mcp_stdio import bounded_stdio

        server.strays = Strays()
        return bounded_stdio(params, server.errlog, server.strays)

    def _explain(self, server: _Server, what: str, since: int = 0) -> str:
        spec = server.spec
        where = spec.url or shlex.join(spec.command)
        text = f"MCP server {spec.name!r} ({where}) {what}."
        tail = stderr_tail(server.errlog, since)
        if tail:
            text += f" Its last output: {tail}"
        if server.strays:
            text += f" It also wrote {server.strays.summary()}."
        return text + " Check the command or URL and restart it in the tools panel."

    async def _stop(self, server: _Server) -> None:
        if server.stop is not None:
            server.stop.set()
        task = server.task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 8.0)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
            except Exception:  # noqa: BLE001,S110 - its failure is already in the server's state
                pass

    async def _call(self, name: str, tool: str, arguments: dict[str, Any]) -> str:
        from mcp import MCPError

        server = self._servers.get(name)
        if server is None:
            raise ToolError(f"no MCP server named {name!r}; add it in the tools panel (or --mcp COMMAND)")
        client = server.client
        if client is None or server.state.status != "ready":
            raise ToolError(f"{server.state.message or 'the MCP server is not running'}")
        since = stderr_size(server.errlog)
        try:
            result = await client.call_tool(tool, arguments, read_timeout_seconds=self.call_timeout_s)
        except MCPError as exc:
            if "closed" in exc.message.lower():  # the process or connection ended
                self._set(
                    server, "died", self._explain(server, f"stopped during a call to {tool}: {exc.message}", since)
                )
                if server.stop is not None:
                    server.stop.set()
                raise ToolError(server.state.message) from None
            raise ToolError(f"MCP server {name!r} could not run {tool}: {exc.message}") from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or f"{tool} failed on the MCP server {name!r}")
        return text
