"""KV tiers below the simulated engine's GPU blocks (docs/sim-kv-tiers.md): the Mooncake store,
spoken for real through Mooncake's own client against the run's real ``mooncake_master``, and
a CPU offload tier, modelled with its size and copy bandwidth.

Each tier answers the same three questions the engine asks of vLLM's connectors: how many
leading blocks of a prompt do you hold (lookup), give me these (load), keep these (save). The
counters are those vLLM 0.33's connectors export, kept in the engine's own stats.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.sim.connectors import (
    OFFLOADING,
    SIMPLE_OFFLOAD,
    STORE,
    TIER_CONNECTORS,
    parse_size,
)

if TYPE_CHECKING:
    from launcher.sim.cli import SimConfig
    from launcher.sim.metrics import EngineStats

# vLLM 0.33 distributed/mooncake_store.py: DEFAULT_GLOBAL_SEGMENT_SIZE, DEFAULT_LOCAL_BUFFER_SIZE
DEFAULT_SEGMENT = 4 * 1024**3
# simple_cpu_offload_connector.py DEFAULT_CPU_CAPACITY_BYTES
DEFAULT_SIMPLE_CPU_BYTES = 8 * 1024**3
CLIENT = Path(__file__).with_name("store_client.py")
SETUP_TIMEOUT_S = 60.0  # the client's store.setup (mounting its segment with the master)

# vLLM 0.33 mooncake/store/metrics.py MooncakeStorePromMetrics: buckets of its histogram
STORE_TIME_BUCKETS = [1e-3, 5e-3, 1e-2, 5e-2, 1e-1, 2e-1, 3e-1, 4e-1, 5e-1, 7.5e-1, 1.0, 1.5,
                      2.0, 3.0, 4.0]
# offloading/metrics.py TRANSFER_SIZE_BUCKETS
OFFLOAD_SIZE_BUCKETS = [1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6]


class TierError(Exception):
    """A tier that cannot start; the engine exits with this sentence, as vLLM would."""


def _extra(kid: dict[str, Any]) -> dict[str, Any]:
    extra = kid.get("kv_connector_extra_config")
    return extra if isinstance(extra, dict) else {}


class StoreOp:
    """One (operation, status) series of vLLM's Mooncake store metrics."""

    __slots__ = ("bytes", "calls", "failed_keys", "hist", "keys")

    def __init__(self) -> None:
        from launcher.sim.metrics import Hist

        self.hist = Hist(STORE_TIME_BUCKETS)
        self.calls = self.keys = self.bytes = self.failed_keys = 0


class Tier:
    """What the engine needs of a tier below its GPU blocks."""

    name = ""
    source = "external_unspecified"  # vLLM's CacheHitSource of its hits
    lookup_enabled = True
    can_save = True

    async def lookup(self, stats: EngineStats, hashes: list[int]) -> int:
        raise NotImplementedError

    async def load(self, stats: EngineStats, hashes: list[int]) -> int:
        """Read ``hashes``' blocks; returns how many leading ones arrived whole."""
        raise NotImplementedError

    def save(self, stats: EngineStats, hashes: list[int]) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        return None


# --- the Mooncake store, for real ------------------------------------------------------------


def store_python(env: dict[str, str], knob: str) -> str:
    """The Python with Mooncake's client: SIM_STORE_PYTHON, else the one beside the
    mooncake_master on PATH (the wheel installs both), else this one."""
    if knob:
        return knob
    master = shutil.which("mooncake_master", path=env.get("PATH"))
    if master:
        beside = Path(master).with_name("python")
        if beside.exists():
            return str(beside)
    return sys.executable


def store_setup(env: dict[str, str], ranks: int) -> dict[str, Any]:
    """What vLLM passes to ``store.setup``, read from MOONCAKE_CONFIG_PATH as its
    ``MooncakeStoreConfig.from_file`` reads it; the pool and buffer are per GPU rank, and this
    one client stands for the process's ``ranks``."""
    path = env.get("MOONCAKE_CONFIG_PATH")
    if not path:
        raise TierError("ValueError: The environment variable 'MOONCAKE_CONFIG_PATH' is not set.")
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise TierError(f"cannot read the Mooncake store config {path}: {exc}") from None
    try:
        segment = parse_size(cfg.get("global_segment_size", DEFAULT_SEGMENT))
        buffer = parse_size(cfg.get("local_buffer_size", DEFAULT_SEGMENT))
    except ValueError as exc:
        raise TierError(f"TypeError: {exc} (in {path})") from None
    if cfg.get("mode", "embedded") != "embedded":
        segment = 0
    return {"local_hostname": env.get("MOONCAKE_LOCAL_HOSTNAME") or "127.0.0.1",
            "metadata_server": cfg.get("metadata_server", ""),
            "global_segment_size": segment * ranks, "local_buffer_size": buffer * ranks,
            "protocol": cfg.get("protocol", "rdma"), "device_name": cfg.get("device_name", ""),
            "master_server_address": cfg.get("master_server_address", "")}


class StoreClient:
    """The store-client process (``store_client.py`` under the Mooncake Python): one per
    simulated engine process, shared by its DP ranks; requests go out as JSON lines and the
    answers come back matched by id."""

    def __init__(self, python: str, setup: dict[str, Any]) -> None:
        self.python = python
        self.setup = setup
        self.proc: asyncio.subprocess.Process | None = None
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.dead: str | None = None

    async def start(self) -> None:
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.python, str(CLIENT), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, limit=1 << 24)
        except OSError as exc:
            raise TierError(f"cannot start the Mooncake store client with {self.python} "
                            f"(SIM_STORE_PYTHON): {exc}") from None
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write((json.dumps(self.setup) + "\n").encode())
        await self.proc.stdin.drain()
        try:
            first = await asyncio.wait_for(self.proc.stdout.readline(), SETUP_TIMEOUT_S)
        except TimeoutError:
            first = b""
        try:
            rc = json.loads(first).get("result") if first else None
        except ValueError:
            rc = None
        if rc != 0:
            await self.close()
            # vLLM's own words (distributed/mooncake_store.py setup_mooncake_store)
            raise TierError("RuntimeError: Initialize MooncakeDistributedStore failed. (master "
                            f"{self.setup['master_server_address']}, client {self.python}"
                            + ("" if first else ": the client printed nothing; is "
                               "mooncake.store importable there? SIM_STORE_PYTHON names it")
                            + ")")
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc and self.proc.stdout
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not an answer (the client sends the library's output to stderr)
            if not isinstance(msg, dict):
                continue
            fut = self._waiting.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        self.dead = "the Mooncake store client exited"
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_result({"error": self.dead})
        self._waiting.clear()

    async def call(self, op: str, keys: list[str], size: int = 0) -> dict[str, Any]:
        if self.dead or self.proc is None or self.proc.stdin is None:
            return {"error": self.dead or "no store client", "s": 0.0}
        self._next += 1
        fut = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = fut
        msg = {"id": self._next, "op": op, "keys": keys, "size": size}
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._waiting.pop(self._next, None)
            return {"error": f"the Mooncake store client is gone: {exc}", "s": 0.0}
        return await fut

    async def close(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            await asyncio.wait_for(self.proc.wait(), 5)
        except (TimeoutError, ConnectionError):
            self.proc.kill()
            await self.proc.wait()


class StoreTier(Tier):
    """MooncakeStoreConnector: keys named as vLLM names them (model, ranks, group, block hash);
    lookups, gets and puts go to the real store, whose master decides what stays."""

    name = STORE

    def __init__(self, cfg: SimConfig, kid: dict[str, Any], client: StoreClient) -> None:
        extra = _extra(kid)
        role = kid.get("kv_role")
        self.client = client
        self.lookup_enabled = bool(extra.get("enable_lookup", True))
        # worker.py: can_put for kv_producer / kv_both, or a consumer with save_decode_cache
        self.can_save = role in ("kv_producer", "kv_both") or bool(
            extra.get("save_decode_cache", False))
        # data.py PoolKey.build_prefix; one key per block for the whole engine (vLLM: one per
        # tensor-parallel rank, each with its shard)
        self.prefix = f"{cfg.model}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0"
        self.value_bytes = cfg.block_size * cfg.knobs.kv_bytes_per_token
        self.pending: set[asyncio.Task[None]] = set()

    def keys(self, hashes: list[int]) -> list[str]:
        return [f"{self.prefix}@{h & 0xFFFFFFFFFFFFFFFF:016x}" for h in hashes]

    def _record(self, stats: EngineStats, op: str, ans: dict[str, Any], keys: int,
                nbytes: int, failed: int) -> None:
        status = "error" if "error" in ans else ("partial_failure" if failed else "ok")
        if status == "error":
            failed = keys
        series = stats.store_ops.setdefault((op, status), StoreOp())
        series.hist.observe(float(ans.get("s", 0.0)))
        series.calls += 1
        series.keys += keys
        series.bytes += nbytes
        series.failed_keys += failed

    async def lookup(self, stats: EngineStats, hashes: list[int]) -> int:
        if not hashes:
            return 0
        ans = await self.client.call("exist", self.keys(hashes))
        self._record(stats, "lookup_exists", ans, len(hashes), 0, 0)
        run = 0
        for v in ans.get("result", []):
            if v != 1:
                break
            run += 1
        return run

    async def load(self, stats: EngineStats, hashes: list[int]) -> int:
        ans = await self.client.call("get", self.keys(hashes), self.value_bytes)
        got = ans.get("result", [])
        run = 0
        for v in got:
            if v != 1:
                break
            run += 1
        failed = len(hashes) - sum(1 for v in got if v == 1) if got else len(hashes)
        self._record(stats, "load_get", ans, len(hashes), len(hashes) * self.value_bytes,
                     failed)
        return run if "error" not in ans else 0

    def save(self, stats: EngineStats, hashes: list[int]) -> None:
        task = asyncio.get_running_loop().create_task(self._save(stats, hashes))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _save(self, stats: EngineStats, hashes: list[int]) -> None:
        """worker.py's save: which keys exist already (save_exists), then put the rest."""
        keys = self.keys(hashes)
        ans = await self.client.call("exist", keys)
        self._record(stats, "save_exists", ans, len(keys), 0, 0)
        if "error" in ans:
            return
        missing = [k for k, v in zip(keys, ans["result"], strict=False) if v != 1]
        if not missing:
            return
        ans = await self.client.call("put", missing, self.value_bytes)
        failed = sum(1 for v in ans.get("result", []) if v != 0)
        self._record(stats, "save_put", ans, len(missing), len(missing) * self.value_bytes,
                     failed)


# --- CPU offload, modelled -------------------------------------------------------------------


class OffloadCounters:
    """The CPU tier's counters, under the names of the connector that owns it."""

    __slots__ = ("load_bytes", "load_hist", "load_time", "outcomes", "store_bytes",
                 "store_hist", "store_time", "load_blocks")

    def __init__(self) -> None:
        from launcher.sim.metrics import Hist

        self.load_bytes = self.store_bytes = 0
        self.load_time = self.store_time = 0.0
        self.load_hist = Hist(OFFLOAD_SIZE_BUCKETS)
        self.store_hist = Hist(OFFLOAD_SIZE_BUCKETS)
        self.load_blocks = 0
        self.outcomes: dict[str, int] = {}


class CpuTier(Tier):
    """OffloadingConnector / SimpleCPUOffloadConnector: the engine's own pool of KV blocks in
    host memory, least recently used out first. Its size is the connector's cpu_bytes_to_use
    (the engine's, over its ranks: TP x PP, vLLM's world size); copies each way take
    bytes / SIM_OFFLOAD_BANDWIDTH_GBPS (scaled by SIM_SPEED). The blocks are bookkeeping only: nothing leaves the process."""

    source = "host"

    def __init__(self, cfg: SimConfig, kid: dict[str, Any]) -> None:
        self.name = str(kid.get("kv_connector"))
        extra = _extra(kid)
        self.block_bytes = cfg.block_size * cfg.knobs.kv_bytes_per_token
        if self.name == SIMPLE_OFFLOAD:
            per = extra.get("cpu_bytes_to_use_per_rank")
            total = int(extra.get("cpu_bytes_to_use", DEFAULT_SIMPLE_CPU_BYTES))
            size = int(per) * cfg.world_size if per is not None else total
        else:
            size = int(extra.get("cpu_bytes_to_use", 0) or 0)
        self.capacity = max(0, size // max(1, self.block_bytes))
        self.bandwidth = cfg.knobs.offload_bandwidth_gbps * 1e9
        self.speed = cfg.knobs.speed
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def _copy_s(self, nbytes: int) -> float:
        return nbytes / self.bandwidth

    async def lookup(self, stats: EngineStats, hashes: list[int]) -> int:
        run = 0
        for h in hashes:
            if h not in self.blocks:
                break
            self.blocks.move_to_end(h)
            run += 1
        return run

    async def load(self, stats: EngineStats, hashes: list[int]) -> int:
        run = 0
        for h in hashes:
            if h not in self.blocks:
                break
            run += 1
        nbytes = run * self.block_bytes
        took = self._copy_s(nbytes)
        await asyncio.sleep(took / self.speed)
        c = stats.offload
        c.load_bytes += nbytes
        c.load_time += took
        c.load_hist.observe(nbytes)
        c.load_blocks += run
        return run

    def save(self, stats: EngineStats, hashes: list[int]) -> None:
        c = stats.offload
        new = 0
        for h in hashes:
            if h in self.blocks:
                self.blocks.move_to_end(h)
                c.outcomes["skipped_already_cached"] = c.outcomes.get(
                    "skipped_already_cached", 0) + 1
                continue
            if not self.capacity:
                c.outcomes["dropped_cpu_full"] = c.outcomes.get("dropped_cpu_full", 0) + 1
                continue
            while len(self.blocks) >= self.capacity:
                self.blocks.popitem(last=False)
            self.blocks[h] = None
            new += 1
        if not new:
            return
        c.outcomes["stored"] = c.outcomes.get("stored", 0) + new
        nbytes = new * self.block_bytes
        c.store_bytes += nbytes
        c.store_time += self._copy_s(nbytes)
        c.store_hist.observe(nbytes)


# --- set-up ---------------------------------------------------------------------------------


async def open_tiers(cfg: SimConfig, env: dict[str, str] | None = None,
                     ranks: int = 1) -> tuple[StoreClient | None, list[dict[str, Any]]]:
    """The store client the process shares (None without a store) and the tier connectors of
    its --kv-transfer-config, in chain order (each engine makes its tiers from them)."""
    env = dict(os.environ) if env is None else env
    kids = [k for k in cfg.kv_chain if k.get("kv_connector") in TIER_CONNECTORS]
    client = None
    if any(k.get("kv_connector") == STORE for k in kids):
        client = StoreClient(store_python(env, cfg.knobs.store_python), store_setup(env, ranks))
        started = time.monotonic()
        await client.start()
        from launcher.sim import vlog

        vlog.info("mooncake_store.py:143", f"Mooncake store client set up with master "
                  f"{client.setup['master_server_address']} ({client.setup['protocol']}) in "
                  f"{time.monotonic() - started:.2f}s (simulated engine; the real client)")
    return client, kids


def attach(engine: Any, kids: list[dict[str, Any]], client: StoreClient | None) -> None:
    """Give ``engine`` its tiers, in chain order, and the counters they keep."""
    cfg = engine.cfg
    for kid in kids:
        if kid.get("kv_connector") == STORE and client is not None:
            engine.tiers.append(StoreTier(cfg, kid, client))
        elif kid.get("kv_connector") in (OFFLOADING, SIMPLE_OFFLOAD):
            engine.tiers.append(CpuTier(cfg, kid))
            engine.stats.offload = OffloadCounters()
