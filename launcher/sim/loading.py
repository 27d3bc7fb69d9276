"""vLLM 0.33's checkpoint-loading lines, spread over the simulated start-up delay.

While ``SIM_START_DELAY_S`` runs, the simulator writes what a vLLM 0.33 engine writes while
it loads a safetensors checkpoint of ``SIM_CHECKPOINT_SHARDS`` shards, so a reader can tell
how far loading got (shard i of N) and how long it took. Formats, from vLLM 0.33.0's source:

1. The progress bar: tqdm on **stderr**, with no log prefix (in 0.33 the process name is a
   log-record field; raw stderr is not prefixed). ``vllm/model_executor/model_loader/
   weight_utils.py`` iterates the shard files with ``tqdm(desc="Loading safetensors checkpoint
   shards", bar_format=_BAR_FORMAT)``, where ``_BAR_FORMAT`` is::

       "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\\n"

   tqdm writes each refresh as ``"\\r" + line + "\\n"`` (then spaces if the line is shorter
   than the previous one), one refresh at 0 and one per shard, and on close the last line
   once more followed by ``"\\n"``. Bytes captured from tqdm 4.70.1 (what pip resolves for
   vLLM 0.33) with 2 shards of 1.3 s::

       \\rLoading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\\n
       \\rLoading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.30s/it]\\n
       \\rLoading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.30s/it]\\n
       \\rLoading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.30s/it]\\n\\n

   ``elapsed``/``remaining`` are ``MM:SS`` (``H:MM:SS`` past an hour, ``?`` before the first
   shard); ``rate_fmt`` is ``f"{rate:5.2f}it/s"``, or ``f"{1/rate:5.2f}s/it"`` when a shard
   takes more than a second. tqdm shows a smoothed rate; the simulator the average one.
   Only the process whose torch.distributed rank is 0 shows the bar (``enable_tqdm``); with
   DP the rank is global (``dp_rank * world_size + rank``), so only the node that hosts DP
   rank 0 prints it. The bar says ``(eager)`` after "shards" with
   ``--safetensors-load-strategy eager``; the simulator prints the default form.
2. Once per engine process, after its weights are in (``default_loader.py``)::

       (EngineCore_DP0 pid=N) INFO MM-DD HH:MM:SS [default_loader.py:506] Loading weights took 12.34 seconds

   ``"Loading weights took %.2f seconds"``; the process is ``EngineCore_DP<global rank>``
   with DP > 1, ``EngineCore`` without (``vllm/v1/engine/utils.py``).
3. Then, from the model runner (V2, the default in 0.33: ``vllm/v1/worker/gpu/
   model_runner.py``)::

       (EngineCore_DP0 pid=N) INFO MM-DD HH:MM:SS [model_runner.py:428] Model loading took 27.46 GiB memory and 12.402871 seconds

   ``"Model loading took %s GiB memory and %.6f seconds"`` with the GiB as
   ``str(round(bytes / 2**30, 2))`` (``format_gib``); the V1 runner logs the same text from
   ``[gpu_model_runner.py:5088]``. The GiB come from ``SIM_MODEL_WEIGHTS_GIB``.

With TP > 1 the lines come from worker processes in vLLM; the simulator names the engine
process. A line-oriented reader should split on ``\\r`` as well as ``\\n``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TextIO

from launcher.sim import vlog
from launcher.sim.cli import SimConfig

DESC = "Loading safetensors checkpoint shards"
BAR_FORMAT = ("{desc}: {percentage:3.0f}% Completed | {n}/{total} "
              "[{elapsed}<{remaining}, {rate_fmt}]\n")
WEIGHTS_WHERE = "default_loader.py:506"
MODEL_WHERE = "model_runner.py:428"


def format_interval(seconds: float) -> str:
    mins, s = divmod(int(seconds), 60)
    h, m = divmod(mins, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def bar_line(n: int, total: int, elapsed: float) -> str:
    """One refresh of vLLM's progress bar (without the leading carriage return)."""
    rate = n / elapsed if n and elapsed > 0 else None
    if rate is None:
        rate_fmt, remaining = "?it/s", "?"
    else:
        rate_fmt = f"{1 / rate:5.2f}s/it" if 1 / rate > 1 else f"{rate:5.2f}it/s"
        remaining = format_interval((total - n) / rate)
    return BAR_FORMAT.format(desc=DESC, percentage=100 * n / total, n=n, total=total,
                             elapsed=format_interval(elapsed), remaining=remaining,
                             rate_fmt=rate_fmt)


class Bar:
    """Writes the bar the way tqdm does: '\\r' + line, padded to the previous length."""

    def __init__(self, total: int, out: TextIO | None = None) -> None:
        self.total = total
        self.out = out or sys.stderr
        self.start = time.monotonic()
        self.n = 0
        self._last_len = 0
        self._write()

    def _write(self) -> None:
        line = bar_line(self.n, self.total, time.monotonic() - self.start)
        self.out.write("\r" + line + " " * max(self._last_len - len(line), 0))
        self.out.flush()
        self._last_len = len(line)

    def update(self, n: int) -> None:
        self.n = n
        self._write()

    def close(self) -> None:
        self._write()
        self.out.write("\n")
        self.out.flush()


def engine_proc(cfg: SimConfig, rank: int) -> str:
    return f"EngineCore_DP{rank}" if cfg.dp_size > 1 else "EngineCore"


def format_gib(gib: float) -> str:
    return f"{round(gib, 2)}"


async def load_weights(cfg: SimConfig) -> None:
    """Loading lines over ``start_delay_s``; never returns with SIM_HANG_BEFORE_HEALTHY."""
    k = cfg.knobs
    shards = max(1, k.checkpoint_shards)
    t0 = time.monotonic()
    bar = Bar(shards) if 0 in cfg.local_ranks else None
    if k.hang_before_healthy:
        await asyncio.Event().wait()  # the fault: stuck at 0/N, never healthy
    for i in range(1, shards + 1):
        if k.start_delay_s > 0:
            await asyncio.sleep(t0 + k.start_delay_s * i / shards - time.monotonic())
        if bar is not None:
            bar.update(i)
    if bar is not None:
        bar.close()
    took = time.monotonic() - t0
    for rank in cfg.local_ranks:
        vlog.info(WEIGHTS_WHERE, f"Loading weights took {took:.2f} seconds",
                  proc=engine_proc(cfg, rank))
    for rank in cfg.local_ranks:
        vlog.info(MODEL_WHERE, f"Model loading took {format_gib(k.model_weights_gib)} GiB "
                               f"memory and {time.monotonic() - t0:.6f} seconds",
                  proc=engine_proc(cfg, rank))
