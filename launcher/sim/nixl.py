"""Simulated NIXL side channel: a real TCP listener per DP rank, and the decode's pull.

A prefill rank listens on VLLM_NIXL_SIDE_CHANNEL_HOST:(VLLM_NIXL_SIDE_CHANNEL_PORT + rank),
like vLLM 0.33's per-engine handshake listener. A decode connects to the ``remote_host`` /
``remote_port`` it was given, asks for the request's blocks (newline-delimited JSON), waits
the modelled transfer time (bytes / bandwidth, scaled by SIM_SPEED) and notifies the
prefill, which frees the blocks. A wrong host or port fails the connect, the request fails
and vllm:nixl_num_failed_transfers rises; every wait is bounded by SIM_CONNECT_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from launcher.sim import ucx, vlog
from launcher.sim.cli import SimConfig
from launcher.sim.engine import Engine, KVTransferError, Req, transfer_cost

# read(request_id, engine_id) -> {"num_tokens", "num_blocks"}; raises KeyError if unknown.
ReadFn = Callable[[str, str], Awaitable[dict[str, Any]]]
DoneFn = Callable[[str], Awaitable[bool]]

_MAX_LINE = 1 << 16


def bind_host(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host


async def serve_side_channel(host: str, port: int, read: ReadFn, done: DoneFn,
                             io_timeout_s: float) -> asyncio.Server:
    """Start the listener of one rank; raises OSError if the port is taken."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await asyncio.wait_for(reader.readline(), io_timeout_s * 4)
                if not line:
                    break
                msg = json.loads(line)
                op = msg.get("op")
                if op == "read":
                    try:
                        meta = await read(str(msg.get("request_id")), str(msg.get("engine_id")))
                        reply: dict[str, Any] = {"ok": True, **meta}
                    except KeyError as exc:
                        reply = {"ok": False, "error": str(exc.args[0] if exc.args else exc)}
                elif op == "done":
                    reply = {"ok": await done(str(msg.get("request_id")))}
                else:
                    reply = {"ok": False, "error": f"unknown op {op!r}"}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (TimeoutError, ConnectionError, json.JSONDecodeError, ValueError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, bind_host(host), port, limit=_MAX_LINE)


def local_handlers(engine: Engine) -> tuple[ReadFn, DoneFn]:
    async def read(request_id: str, engine_id: str) -> dict[str, Any]:
        if engine.cfg.is_producer and engine.fails_kv(request_id):
            # Injected on the prefill side: its blocks cannot be read (a broken P->D path).
            raise KeyError("NIXL read of the prefill's blocks failed (injected by "
                           "SIM_KV_FAIL_FRACTION on the prefill)")
        return engine.read_held(request_id, engine_id)

    async def done(request_id: str) -> bool:
        return engine.release_held(request_id)

    return read, done


# vLLM 0.33's lines once a decode holds a prefill's NIXL metadata (nixl/base_worker.py).
HANDSHAKE_WHERE = "base_worker.py:1210"
PLAN_WHERE = "base_worker.py:2525"


def make_pull(cfg: SimConfig) -> Callable[[Engine, Req], Awaitable[None]]:
    """The consumer's KV pull (assigned to Engine.pull)."""
    timeout = cfg.knobs.connect_timeout_s
    speed = cfg.knobs.speed
    # One handshake per (decode rank, prefill listener), shared by the requests that wait
    # on it; a failed one is forgotten so the next request tries again (as vLLM does).
    handshakes: dict[tuple[int, str, int], asyncio.Future] = {}

    async def handshake(engine: Engine, host: str, port: int, engine_id: str) -> None:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        w.close()
        await asyncio.sleep(cfg.knobs.handshake_delay_s)  # a fault timer: not scaled
        digest = hashlib.sha256(f"{cfg.model}|{cfg.block_size}".encode()).hexdigest()
        vlog.info(HANDSHAKE_WHERE, f"NIXL compatibility check passed (hash: {digest})",
                  proc=_worker(engine))
        vlog.info(PLAN_WHERE, f"Transfer plan: TransferTopology(tp_ratio=1, local_tp=1, "
                  f"remote_tp=1, remote_engine_id={engine_id}, local_rank=0)",
                  proc=_worker(engine))

    async def ensure_handshake(engine: Engine, host: str, port: int, engine_id: str) -> None:
        key = (engine.rank, host, port)
        fut = handshakes.get(key)
        if fut is None:
            fut = handshakes[key] = asyncio.ensure_future(handshake(engine, host, port, engine_id))
        try:
            await asyncio.shield(fut)
        except (OSError, TimeoutError) as exc:
            handshakes.pop(key, None)
            raise KVTransferError(f"handshake with {host}:{port} failed: {exc!r}") from None

    async def pull(engine: Engine, req: Req) -> None:
        params = req.remote or {}
        host = params.get("remote_host")
        port = params.get("remote_port")
        if not host or not isinstance(port, int):
            raise KVTransferError("kv_transfer_params lack remote_host/remote_port")
        await ensure_handshake(engine, host, port, str(params.get("remote_engine_id")))
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=_MAX_LINE), timeout)
        except (OSError, TimeoutError) as exc:
            raise KVTransferError(f"handshake with {host}:{port} failed: {exc!r}") from None
        try:
            msg = {"op": "read", "request_id": params.get("remote_request_id"),
                   "engine_id": params.get("remote_engine_id")}
            writer.write(json.dumps(msg).encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), timeout)
            if not line:
                raise KVTransferError(f"{host}:{port} closed the side channel")
            meta = json.loads(line)
            if not meta.get("ok"):
                raise KVTransferError(str(meta.get("error")))
            # only the blocks past the decode's local prefix-cache hit are read
            # (req.external); with none, the prefill is only notified (no transfer)
            tokens = req.external
            xfer, post, nbytes, descs = transfer_cost(cfg, tokens)
            t0 = time.time()
            if tokens:
                await asyncio.sleep(xfer / speed)
                if req.fail_kv:
                    # Injected fault: the read fails; the prefill keeps the blocks until the
                    # lease runs out, as with a real failed NIXL read.
                    raise KVTransferError(
                        "NIXL transfer failed (injected by SIM_KV_FAIL_FRACTION)")
            measured = time.time() - t0
            writer.write(json.dumps({"op": "done", "request_id": msg["request_id"]}).encode()
                         + b"\n")
            await writer.drain()
            await asyncio.wait_for(reader.readline(), timeout)
            # UCX_PROTO_INFO=y: UCX names the transport at the first read of each engine
            gpu = (engine.rank - cfg.dp_start_rank) % max(1, cfg.dp_size_local)
            ucx.report_once(engine, cfg.knobs.ucx_transport, gpu, gpu,
                            intra_node=host in ("127.0.0.1", "localhost", "::1",
                                                cfg.side_channel_host))
            if tokens:
                engine.record_transfer(measured, post / speed, nbytes, descs)
        except (OSError, TimeoutError, ValueError) as exc:
            raise KVTransferError(f"side channel {host}:{port}: {exc!r}") from None
        finally:
            writer.close()

    return pull


def _worker(engine: Engine) -> str:
    """The process vLLM names in a worker's log records: 'Worker' (DP1), 'EngineCore_DP<r>'."""
    return f"EngineCore_DP{engine.rank}" if engine.cfg.dp_size > 1 else "Worker"
