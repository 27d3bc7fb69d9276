"""One engine over several nodes (--nnodes N --node-rank R --master-addr A --master-port P):
its tensor x pipeline parallel workers span N nodes, as vLLM's multi-node launch.

Node rank 0 runs the API server and the engine; it serves only once every other node's
workers have joined at A:P (vLLM's workers meet in torch.distributed's rendezvous there, so
the head waits for them). Nodes 1..N-1 are --headless: their workers hold a share of the
weights and KV; the simulated engine's scheduler, KV and NIXL side channel live on the head.
If a node goes away the head exits non-zero; if the head goes away, so do the nodes.
"""

from __future__ import annotations

import asyncio
import json
import os

from launcher.sim import vlog
from launcher.sim.cli import SimConfig
from launcher.sim.dp import _LIMIT, FailFn, _send, connect_retrying
from launcher.sim.nixl import bind_host

WHERE = "multiproc_executor.py"  # vLLM's executor starts the workers of every node


class Rendezvous:
    """The head's side: wait for nodes 1..N-1, then watch them."""

    def __init__(self, cfg: SimConfig, fail: FailFn) -> None:
        self.cfg = cfg
        self.fail = fail
        self.joined: set[int] = set()
        self.all_joined = asyncio.Event()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self._closing = False

    @property
    def workers_per_node(self) -> int:
        return self.cfg.world_size // self.cfg.nnodes

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, bind_host(self.cfg.master_addr), self.cfg.master_port, limit=_LIMIT)
        vlog.info(WHERE, f"Waiting for {self.cfg.nnodes - 1} other node(s) of world size "
                         f"{self.cfg.world_size} at {self.cfg.master_addr}:"
                         f"{self.cfg.master_port}")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        msg = json.loads(line) if line else {}
        rank = msg.get("node_rank")
        if (msg.get("op") != "join" or not isinstance(rank, int) or not 0 < rank < self.cfg.nnodes
                or rank in self.joined or msg.get("nnodes") != self.cfg.nnodes):
            _send(writer, {"op": "error", "error": f"node rank {rank} of {msg.get('nnodes')} "
                           f"does not fit --nnodes {self.cfg.nnodes} (or joined already)"})
            await writer.drain()
            writer.close()
            return
        self.joined.add(rank)
        self._writers.append(writer)
        _send(writer, {"op": "ok"})
        await writer.drain()
        first = rank * self.workers_per_node
        vlog.info(WHERE, f"Node rank {rank} joined (pid {msg.get('pid')}): worker "
                         f"ranks {first}-{first + self.workers_per_node - 1}")
        if len(self.joined) == self.cfg.nnodes - 1:
            self.all_joined.set()
        await reader.read()  # until the node goes away
        if not self._closing:
            vlog.error(WHERE, f"Node rank {rank} of the tensor parallel group died; shutting "
                              "down the engine.")
            self.fail(1)

    def close(self) -> None:
        self._closing = True
        for w in self._writers:
            try:
                _send(w, {"op": "shutdown"})
                w.close()
            except (ConnectionError, RuntimeError):
                pass
        if self._server is not None:
            self._server.close()


async def join(cfg: SimConfig, fail: FailFn) -> asyncio.Task[None]:
    """A headless node's side: join the head, then live as long as it does."""
    loop = asyncio.get_running_loop()
    reader, writer = await connect_retrying(cfg.master_addr, cfg.master_port,
                                            cfg.knobs.headless_wait_s, "node rank 0",
                                            "--master-addr and --master-port")
    _send(writer, {"op": "join", "node_rank": cfg.node_rank, "nnodes": cfg.nnodes,
                   "pid": os.getpid()})
    await writer.drain()
    line = await reader.readline()
    msg = json.loads(line) if line else {"op": "error", "error": "node rank 0 closed"}
    if msg.get("op") != "ok":
        raise ConnectionError(f"node rank 0 refused node rank {cfg.node_rank}: "
                              f"{msg.get('error')}")
    per = cfg.world_size // cfg.nnodes
    vlog.info(WHERE, f"Headless node rank {cfg.node_rank} of {cfg.nnodes}: worker "
                     f"ranks {cfg.node_rank * per}-{(cfg.node_rank + 1) * per - 1} running")

    async def watch() -> None:
        clean = False
        try:
            while line := await reader.readline():
                if json.loads(line).get("op") == "shutdown":
                    clean = True
                    break
        except (ConnectionError, ValueError):
            pass
        writer.close()  # held open until here: a collected writer closes its connection
        if not clean:
            vlog.error(WHERE, "Connection to node rank 0 lost; shutting down the workers.")
        fail(0 if clean else 1)

    return loop.create_task(watch())
