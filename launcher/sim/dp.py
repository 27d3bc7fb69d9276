"""Multi-node data parallel over the DP RPC address: the head and its remote parts.

The head (start rank 0, an API server) listens on --data-parallel-address:
--data-parallel-rpc-port and becomes ready only when the remote parts have registered every
remote rank, like vLLM's DP handshake (v1/engine/utils.py, wait_for_engine_startup). Two
layouts, as in vLLM 0.33:

- internal LB: the remote parts are --headless. The head simulates all engines (their
  schedulers and metrics, which vLLM's API server reports for every engine anyway); a
  headless part serves its ranks' NIXL side channels on its own node and relays reads to
  the head.
- hybrid LB (one front per node, ``SimConfig.hybrid_lb``): the remote parts are fronts with
  their own API server. Each front simulates only its own ranks; the head only waits for
  them, then tells them the DP coordinator is ready (vLLM's engines wait for that READY
  before their front can serve, v1/engine/core.py:1281-1285).

A remote part of the wrong kind is refused with vLLM's error (utils.py:1502-1515). If a
registered part goes away the head exits non-zero (vLLM: engine core died); if the head
goes away, so does the part. Wire format: newline-delimited JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

from launcher.sim import vlog
from launcher.sim.cli import SimConfig
from launcher.sim.nixl import bind_host

_LIMIT = 1 << 20

# Called with an exit code when the process must stop (a peer died).
FailFn = Callable[[int], None]


async def connect_retrying(host: str, port: int, wait_s: float, what: str, flags: str,
                           ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to `what` at host:port, tried every 0.2 s for `wait_s` (a remote part
    may start before its head listens); ConnectionError naming the `flags` to check."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=_LIMIT), 5)
        except (OSError, TimeoutError):
            if loop.time() > deadline:
                raise ConnectionError(f"could not reach {what} at {host}:{port} within "
                                      f"{wait_s:.0f} s; check {flags}") from None
            await asyncio.sleep(0.2)


def _send(writer: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
    writer.write(json.dumps(msg).encode() + b"\n")


class Head:
    """The head's side of the DP handshake and the relay of side-channel reads."""

    def __init__(self, cfg: SimConfig, engine_id: str, fail: FailFn) -> None:
        self.cfg = cfg
        self.engine_id = engine_id
        self.fail = fail
        self.remote_hosts: dict[int, str] = {}  # headless ranks -> side-channel host
        self.front_ranks: set[int] = set()  # ranks simulated by remote fronts
        self.engines: dict[int, Any] = {}  # rank -> Engine, set once ready
        self.ready = asyncio.Event()
        self.error: Exception | None = None  # raised by the waiter instead of serving
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._fronts: list[asyncio.StreamWriter] = []
        self._expected = set(range(cfg.dp_size)) - set(cfg.local_ranks)
        self._closing = False

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, bind_host(self.cfg.dp_address), self.cfg.dp_rpc_port, limit=_LIMIT)
        # The coordinator is a process of its own in vLLM; the sim has none to name.
        vlog.info("utils.py:1279", f"Started DP Coordinator process (PID: {os.getpid()})")
        if not self._expected:
            self._set_ready()
        else:
            vlog.info("core_client.py:1010",
                      f"Waiting for {len(self._expected)} remote DP ranks "
                      f"{sorted(self._expected)} to connect to "
                      f"{self.cfg.dp_address}:{self.cfg.dp_rpc_port}")

    def _registered(self) -> set[int]:
        return set(self.remote_hosts) | self.front_ranks

    def _set_ready(self) -> None:
        self.ready.set()
        vlog.info("coordinator.py:256", "All engine subscriptions received by DP coordinator",
                  proc="DPCoordinator")
        for w in self._fronts:
            try:
                _send(w, {"op": "ready"})
            except (ConnectionError, RuntimeError):
                pass

    def shutdown(self) -> None:
        self._closing = True
        for w in self._writers:
            try:
                _send(w, {"op": "shutdown"})
                w.close()
            except (ConnectionError, RuntimeError):
                pass

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ranks: list[int] = []
        front = False
        try:
            line = await asyncio.wait_for(reader.readline(), 30)
            msg = json.loads(line) if line else {}
            if msg.get("op") != "register":
                writer.close()
                return
            ranks = [int(r) for r in msg.get("ranks", [])]
            front = bool(msg.get("front"))
            bad = [r for r in ranks if r not in self._expected or r in self._registered()]
            if bad or msg.get("dp_size") != self.cfg.dp_size:
                _send(writer, {"op": "error", "error":
                               f"ranks {bad or ranks} are not expected by the head "
                               f"(data parallel size {self.cfg.dp_size})"})
                await writer.drain()
                writer.close()
                return
            if ranks and front != self.cfg.hybrid_lb:
                # vLLM raises this in the head while it waits for its engines
                # (v1/engine/utils.py:1503-1515): the head fails to start.
                error = (f"Remote engine {ranks[0]} must use --headless unless in external "
                         "or hybrid dp lb mode" if front else
                         f"Remote engine {ranks[0]} must not use --headless in external or "
                         "hybrid dp lb mode")
                _send(writer, {"op": "error", "error": error})
                await writer.drain()
                writer.close()
                if not self.ready.is_set():
                    self.error = RuntimeError(error)
                    self.ready.set()
                return
            if front:
                self.front_ranks.update(ranks)
                self._fronts.append(writer)
            else:
                for r in ranks:
                    self.remote_hosts[r] = str(msg.get("host") or "localhost")
            self._writers.append(writer)
            vlog.info("core_client.py:1031",
                      f"DP ranks {ranks} registered from pid {msg.get('pid')} "
                      + ("(a front with its own API server)" if front else
                         f"(side channel host {msg.get('host')})"))
            _send(writer, {"op": "ok", "engine_id": self.engine_id})
            await writer.drain()
            if self._registered() >= self._expected and not self.ready.is_set():
                self._set_ready()
            while True:
                line = await reader.readline()
                if not line:
                    break
                req = json.loads(line)
                _send(writer, await self._relay(req))
                await writer.drain()
        except (ConnectionError, TimeoutError, json.JSONDecodeError, ValueError):
            pass
        if not ranks or self._closing or ranks[0] not in self._registered():
            return
        if front:
            # A remote front's engines are not this client's; vLLM 0.33's line for a dead
            # engine core (v1/engine/core_client.py:839-841) does not name them.
            vlog.warning("sim.py:4", f"the front of DP ranks {ranks} went away")
            vlog.warning("core_client.py:839",
                         "[shutdown] MPClient: engine core exited unexpectedly; starting "
                         "cleanup")
        else:
            vlog.error("core_client.py:716",
                       f"Engine core proc EngineCore_DP{ranks[0]} died unexpectedly, "
                       "shutting down client.")
        self.fail(1)

    async def _relay(self, req: dict[str, Any]) -> dict[str, Any]:
        await self.ready.wait()
        engine = self.engines.get(int(req.get("rank", -1)))
        rid = req.get("id")
        if engine is None:
            return {"id": rid, "ok": False, "error": "unknown rank"}
        if req.get("op") == "read":
            try:
                meta = engine.read_held(str(req.get("request_id")), str(req.get("engine_id")))
            except KeyError as exc:
                return {"id": rid, "ok": False, "error": str(exc.args[0] if exc.args else exc)}
            return {"id": rid, "ok": True, **meta}
        if req.get("op") == "done":
            return {"id": rid, "ok": engine.release_held(str(req.get("request_id")))}
        return {"id": rid, "ok": False, "error": "unknown op"}


class HeadlessLink:
    """A remote part's connection to the head: a headless part's (relays side-channel
    reads) or, with ``front``, a hybrid-LB front's (waits for the coordinator's ready)."""

    def __init__(self, cfg: SimConfig, fail: FailFn, front: bool = False) -> None:
        self.cfg = cfg
        self.fail = fail
        self.front = front
        self.ready = asyncio.Event()  # the head's DP coordinator saw every rank
        self.engine_id = ""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._next = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        self._reader, self._writer = await connect_retrying(
            cfg.dp_address, cfg.dp_rpc_port, cfg.knobs.headless_wait_s, "the DP head",
            "--data-parallel-address and --data-parallel-rpc-port")
        _send(self._writer, {"op": "register", "ranks": cfg.local_ranks,
                             "dp_size": cfg.dp_size, "host": cfg.side_channel_host,
                             "pid": os.getpid(), "front": self.front})
        await self._writer.drain()
        line = await asyncio.wait_for(self._reader.readline(), 30)
        msg = json.loads(line) if line else {"op": "error", "error": "head closed"}
        if msg.get("op") != "ok":
            raise ConnectionError(f"the DP head refused ranks {cfg.local_ranks}: "
                                  f"{msg.get('error')}")
        self.engine_id = str(msg["engine_id"])
        self._task = loop.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        assert self._reader is not None
        clean = False
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                msg = json.loads(line)
                if msg.get("op") == "shutdown":
                    clean = True
                    break
                if msg.get("op") == "ready":
                    self.ready.set()
                    continue
                fut = self._pending.pop(int(msg.get("id", -1)), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (ConnectionError, json.JSONDecodeError, ValueError):
            pass
        if not clean:
            vlog.error("core.py:1080", "DP head connection lost; shutting down engine cores.")
        self.fail(0 if clean else 1)

    async def wait_ready(self) -> None:
        """Until the head's coordinator has every rank, as each of vLLM's DP engines waits
        for it before its front can serve (saying so every 10 s)."""
        while True:
            try:
                await asyncio.wait_for(self.ready.wait(), 10)
                return
            except TimeoutError:
                for r in self.cfg.local_ranks:
                    vlog.info("core.py:1285", "Waiting for READY message from DP Coordinator...",
                              proc=f"EngineCore_DP{r}")

    async def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self._writer is not None
        self._next += 1
        rid = self._next
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        _send(self._writer, {**msg, "id": rid})
        await self._writer.drain()
        try:
            return await asyncio.wait_for(fut, self.cfg.knobs.connect_timeout_s)
        finally:
            self._pending.pop(rid, None)

    def handlers(self, rank: int) -> tuple[Any, Any]:
        async def read(request_id: str, engine_id: str) -> dict[str, Any]:
            reply = await self.call({"op": "read", "rank": rank, "request_id": request_id,
                                     "engine_id": engine_id})
            if not reply.get("ok"):
                raise KeyError(str(reply.get("error")))
            return {k: v for k, v in reply.items() if k not in ("ok", "id")}

        async def done(request_id: str) -> bool:
            reply = await self.call({"op": "done", "rank": rank, "request_id": request_id})
            return bool(reply.get("ok"))

        return read, done
