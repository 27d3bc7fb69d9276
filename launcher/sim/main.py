"""Process wiring of the simulated ``vllm serve``: start-up, faults, DP, listeners, HTTP."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from launcher.sim import knobs, loading, vlog
from launcher.sim.argv import VllmArgError, VllmStartupError
from launcher.sim.cli import SimConfig, UsageError, parse


async def _serve(cfg: SimConfig, fail: asyncio.Future[int]) -> list[object]:
    """Bring the part up; returns objects to close at exit. Runs as a task."""
    from aiohttp import web

    from launcher.sim import connectors, nixl, statslog, tiers
    from launcher.sim.answers import Answerer
    from launcher.sim.dp import Head, HeadlessLink
    from launcher.sim.engine import Engine
    from launcher.sim.server import Api, UvicornAccessLog, uvicorn_startup

    def stop(code: int) -> None:
        if not fail.done():
            fail.set_result(code)

    closers: list[object] = []
    k = cfg.knobs
    # vLLM's checkpoint-loading lines, spread over SIM_START_DELAY_S (never ends with the
    # SIM_HANG_BEFORE_HEALTHY fault).
    await loading.load_weights(cfg)

    rendezvous = None
    if cfg.nnodes > 1:
        from launcher.sim import tp

        if cfg.node_rank > 0:
            try:
                closers.append(await tp.join(cfg, stop))
            except ConnectionError as exc:
                vlog.error(tp.WHERE, str(exc))
                stop(1)
            return closers
        rendezvous = tp.Rendezvous(cfg, stop)
        await rendezvous.start()
        closers.append(rendezvous)
        await rendezvous.all_joined.wait()

    if cfg.headless:
        link = HeadlessLink(cfg, stop)
        try:
            await link.connect()
        except ConnectionError as exc:
            vlog.error("core.py:1080", str(exc))
            stop(1)
            return closers
        if cfg.nixl:
            for rank in cfg.local_ranks:
                read, done = link.handlers(rank)
                closers.append(await nixl.serve_side_channel(
                    cfg.side_channel_host, cfg.side_channel_port + rank, read, done,
                    k.connect_timeout_s))
        vlog.info("core.py:1102", f"Headless engine cores for DP ranks {cfg.local_ranks} are "
                                  f"running (side channel {cfg.side_channel_host})")
        return closers

    head = Head(cfg, cfg.engine_id, stop)
    remote = cfg.dp_start_rank == 0 and cfg.dp_size_local < cfg.dp_size
    if remote:
        await head.start()
        closers.append(head)
        await head.ready.wait()
        if head.error is not None:
            raise head.error
    elif cfg.hybrid_lb:
        # A front on another node: its engines rendezvous with the head's coordinator.
        link = HeadlessLink(cfg, stop, front=True)
        closers.append(link)  # keeps its read loop alive: the failure coupling
        try:
            await link.connect()
        except ConnectionError as exc:
            vlog.error("core.py:1080", str(exc))
            stop(1)
            return closers
        await link.wait_ready()
    # Hybrid LB: this front's client manages only its local engines, under their global
    # ranks (vLLM 0.33 v1/engine/core_client.py:743-747).
    ranks = list(range(cfg.dp_size)) if remote and not cfg.hybrid_lb else cfg.local_ranks
    hosts = {r: cfg.side_channel_host for r in cfg.local_ranks}
    hosts.update(head.remote_hosts)
    engines = [Engine(cfg, r, cfg.engine_id, hosts[r]) for r in ranks]
    head.engines = {e.rank: e for e in engines}
    if any(k.get("kv_connector") in connectors.TIER_CONNECTORS for k in cfg.kv_chain):
        try:
            client, kids = await tiers.open_tiers(
                cfg, ranks=len(engines) * max(1, cfg.world_size // cfg.nnodes))
        except tiers.TierError as exc:
            vlog.error("core.py:1586", f"EngineCore failed to start: {exc}", proc="EngineCore_DP0")
            stop(1)
            return closers
        if client is not None:
            closers.append(client)
        for e in engines:
            tiers.attach(e, kids, client)
    if cfg.is_consumer:
        pull = nixl.make_pull(cfg)
        for e in engines:
            e.pull = pull
    for e in engines:
        e.start()
    if cfg.nixl:
        for e in engines:
            if e.rank in cfg.local_ranks:
                read, done = nixl.local_handlers(e)
                closers.append(await nixl.serve_side_channel(
                    cfg.side_channel_host, e.side_channel_port, read, done,
                    k.connect_timeout_s))
    if cfg.aggregate_engine_logging and cfg.stats_logging:
        vlog.info(statslog.INIT_WHERE, f"{len(engines)} Engines: vllm cache_config_info with "
                                       f"initialization after num_gpu_blocks is: "
                                       f"{cfg.num_gpu_blocks}")
    api = Api(cfg, engines, Answerer(k.answer_key, k.accuracy, k.wrong_answers))
    if not cfg.scale_out:
        from launcher.sim.server import SCALE_OUT_DISABLED, SCALE_OUT_WHERE

        vlog.info(SCALE_OUT_WHERE, SCALE_OUT_DISABLED)
    if cfg.access_log:
        runner = web.AppRunner(api.app(), handler_cancellation=True,
                               access_log_class=UvicornAccessLog,
                               access_log=logging.getLogger("uvicorn.access"))
    else:
        runner = web.AppRunner(api.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    closers.append(runner)
    host = cfg.host or "0.0.0.0"
    site = web.TCPSite(runner, host, cfg.port, backlog=4096, reuse_address=True)
    await site.start()
    if cfg.stats_logging:
        asyncio.get_running_loop().create_task(statslog.run_stats_logger(
            engines, cfg.log_stats_interval, cfg.aggregate_engine_logging))
    elif cfg.api_server_count > 1:
        for i in range(cfg.api_server_count):
            vlog.warning(statslog.MULTI_API_WHERE, statslog.MULTI_API_MSG,
                         proc=f"ApiServer_{i}")
    # vLLM 0.33's entry point (vllm/entrypoints/launchers/api_server/entry.py), then uvicorn's
    vlog.info("entry.py:139", f"Starting vLLM server on http://{host}:{cfg.port}")
    uvicorn_startup()
    return closers


async def run(cfg: SimConfig) -> int:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def stop(code: int) -> None:
        if not done.done():
            done.set_result(code)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, 0)
    if cfg.knobs.crash_after_s > 0:
        def crash() -> None:
            if cfg.knobs.crash_cause:
                vlog.record("ERROR", "core.py:1586", crash_record(cfg.knobs.crash_cause),
                            proc="EngineCore_DP0")
            vlog.error("core_client.py:716", "Engine core proc EngineCore_DP0 died "
                                             "unexpectedly (simulated crash: SIM_CRASH_AFTER_S)")
            stop(1)
        loop.call_later(cfg.knobs.crash_after_s, crash)

    task = loop.create_task(_serve(cfg, done))
    closers: list[object] = []

    def started(t: asyncio.Task[list[object]]) -> None:
        if t.cancelled():
            return
        exc = t.exception()
        if exc is not None:
            vlog.error("api_server.py:2100", f"{type(exc).__name__}: {exc}")
            stop(1)
        else:
            closers.extend(t.result())

    task.add_done_callback(started)
    code = await done
    if not task.done():
        task.cancel()
    from aiohttp import web

    from launcher.sim.dp import Head
    from launcher.sim.tiers import StoreClient
    from launcher.sim.tp import Rendezvous

    for c in closers:
        try:
            if isinstance(c, Head):
                c.shutdown()
            elif isinstance(c, Rendezvous):
                c.close()
            elif isinstance(c, web.AppRunner):
                await asyncio.wait_for(c.cleanup(), 2)
            elif isinstance(c, asyncio.Server):
                c.close()
            elif isinstance(c, StoreClient):
                await c.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    return code


# The error each crash cause ends its traceback with (PyTorch's and torch.distributed's
# wording, docs/log-signals.md); the GPU figures are the simulated GB200's.
CRASH_ERRORS = {
    "oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has "
           "a total capacity of 184.00 GiB of which 1.12 GiB is free. (simulated: "
           "SIM_CRASH_CAUSE=oom)",
    "nccl": "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/"
            "distributed/c10d/NCCLUtils.cpp:77, unhandled system error (run with "
            "NCCL_DEBUG=INFO for details), NCCL version 2.27.3 (simulated: SIM_CRASH_CAUSE=nccl)",
    "exception": "RuntimeError: simulated engine failure (SIM_CRASH_CAUSE=exception)",
}


def crash_record(cause: str) -> list[str]:
    """vLLM's record of a dead engine core: the fatal-error line and its traceback."""
    error = CRASH_ERRORS.get(cause, CRASH_ERRORS["exception"])
    return ["EngineCore encountered a fatal error.",
            "Traceback (most recent call last):",
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", '
            "line 1570, in run_engine_core",
            "    engine_core.run_busy_loop()",
            error]

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = parse(argv)
    except VllmArgError as exc:  # argparse's own text, as vLLM prints it
        sys.stdout.write(exc.out)
        sys.stderr.write(exc.text)
        return exc.code
    except VllmStartupError as exc:  # vLLM raises these (a traceback, exit 1)
        print(str(exc), file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    vlog.set_process_name(f"EngineCore_DP{cfg.dp_start_rank}" if cfg.headless else "APIServer")
    vlog.warning("sim.py:1", "This is a SIMULATED engine (launcher.sim), not vLLM: no GPU, no "
                             "weights; latencies come from a speed model "
                             f"(SIM_SPEED={cfg.knobs.speed:g}).")
    vlog.info("utils.py:253", f"vLLM API server version {'0.33.0'} (simulated)")
    vlog.info("utils.py:254", f"non-default args: model_tag={cfg.model!r}, "
                              f"data_parallel_size={cfg.dp_size}, "
                              f"data_parallel_size_local={cfg.dp_size_local}, "
                              f"data_parallel_start_rank={cfg.dp_start_rank}, "
                              f"headless={cfg.headless}, kv_role={cfg.kv_role!r}, "
                              f"block_size={cfg.block_size}, num_gpu_blocks={cfg.num_gpu_blocks}")
    for where, msg in cfg.argv_warnings:
        vlog.warning(where, msg)
    capacity = (cfg.num_gpu_blocks - cfg.knobs.state_blocks_per_request) * cfg.block_size
    if cfg.num_gpu_blocks_override is None and capacity < cfg.max_model_len:
        # vLLM refuses to start when one request of max_model_len cannot fit (check_enough_
        # kv_cache_memory); the simulator counts tokens where vLLM counts bytes.
        vlog.error("core.py:1090", "EngineCore failed to start.")
        print(f"ValueError: To serve at least one request with the models's max seq len "
              f"({cfg.max_model_len}), the KV cache needs {cfg.max_model_len} tokens, which is "
              f"more than it holds ({capacity} tokens). Based on the available memory, the "
              f"estimated maximum model length is {capacity}. Try increasing "
              f"`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
              f"engine.", file=sys.stderr)
        return 1
    unknown = knobs.unknown_env()
    if unknown:
        vlog.warning("sim.py:3", "unknown simulation knobs (ignored): " + ", ".join(unknown)
                     + "; see python -m launcher.sim serve X --sim-help")
    if cfg.ignored_flags:
        vlog.warning("sim.py:2", "launcher.sim cannot model these flags and ignores them: "
                                 + ", ".join(cfg.ignored_flags))
    try:
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
    except ImportError:
        pass
    try:
        return asyncio.run(run(cfg))
    except KeyboardInterrupt:
        return 0
