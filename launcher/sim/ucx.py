"""UCX's protocol-selection report (``UCX_PROTO_INFO=y``) at a decode's first KV transfer.

A real decode engine reads KV blocks with NIXL's UCX backend (``ucp_get_nbx``). When the
engine's environment has ``UCX_PROTO_INFO=y``, UCX prints, the first time it selects a
protocol for an operation, a table naming the transport it chose: the way to see a silent
fall-back to TCP on a job that spans racks. The simulator prints the same table at each
engine's first KV read, naming the transport from ``SIM_UCX_TRANSPORT`` (default
``cuda_ipc``; ``tcp`` imitates the fall-back).

Format, from UCX's source (openucx/ucx, tag v1.22.0, commit 8a6b06fb880a, the newest release
in the snapshot read; ``src/ucp/proto/proto_debug.c`` ``ucp_proto_select_elem_info``,
``src/ucs/debug/table.c`` ``ucs_table_render``, ``src/ucs/debug/log.c``
``ucs_log_print_compact``, ``src/ucp/core/ucp_ep.c`` ``ucp_ep_config_name``,
``src/ucp/proto/proto.c`` ``ucp_operation_descs``). Each line of the table is printed to
UCX's log stream (stdout by default) after the compact prefix
``"[%lu.%06lu] [%s:%-5d:%s]   "`` (seconds.microseconds, hostname, pid, thread number)::

    [1764412800.123456] [gb200-07:4242 :0]   +--------+-------------+-----------------------------------------+
    [1764412800.123456] [gb200-07:4242 :0]   | ucp_context_0 inter-node cfg#1                                 |
    [1764412800.123456] [gb200-07:4242 :0]   | remote memory read by ucp_get* into cuda/GPU0 from cuda/dev[0] |
    [1764412800.123456] [gb200-07:4242 :0]   +--------+-------------+-----------------------------------------+
    [1764412800.123456] [gb200-07:4242 :0]   | Range  | Description |                 Config                  |
    [1764412800.123456] [gb200-07:4242 :0]   +--------+-------------+-----------------------------------------+
    [1764412800.123456] [gb200-07:4242 :0]   | 0..inf | zero-copy   | cuda_ipc/cuda                           |
    [1764412800.123456] [gb200-07:4242 :0]   +--------+-------------+-----------------------------------------+

(widths are computed: the two title rows span all three columns and widen the last one).
Rows: the endpoint configuration (``[<context name> ]{self|intra-node|inter-node} cfg#<n>``),
the operation (``remote memory read by ucp_get*``, `` into `` the local buffer's
``<memory type>/<device>``, `` from `` the remote key's ``<memory type>/dev[<n>]``), a
separator, the centred headers ``Range | Description | Config``, a separator, one row per
message-size range (``0..inf``; description ``zero-copy`` for a transport that reads remote
memory directly, ``software emulation`` for TCP, which has no GET zero-copy; config
``<transport>/<device>``, e.g. ``cuda_ipc/cuda``, ``tcp/eth0``, ``rc_mlx5/mlx5_0:1``) and the
bottom frame. ``UCX_PROTO_INFO`` takes y/yes/on/1 (UCX's boolean), ``auto`` (only when
``UCX_LOG_LEVEL`` is debug or finer) or a glob matched, case-insensitively, against the
operation row. UCX releases up to 1.21 drew the same table without the header row.
Simplifications: one context (``ucp_context_0``) and endpoint config ``cfg#1`` (NIXL's
agent connects to itself first), GPU/device numbers from the local DP rank.
"""

from __future__ import annotations

import fnmatch
import os
import socket
import time
from collections.abc import Callable

_TRUE = {"y", "yes", "on", "1"}
_FALSE = {"n", "no", "off", "0"}
_DEBUG_LEVELS = {"debug", "trace", "req", "data", "async", "func", "poll"}
_DEFAULT_DEVICE = {"cuda_ipc": "cuda", "cuda_copy": "cuda", "tcp": "eth0", "self": "memory",
                   "sysv": "memory", "posix": "memory"}


def enabled(env: dict[str, str], sel_param: str) -> bool:
    value = env.get("UCX_PROTO_INFO", "auto")
    low = value.lower()
    if low == "auto":
        return env.get("UCX_LOG_LEVEL", "warn").lower() in _DEBUG_LEVELS
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    return fnmatch.fnmatch(sel_param.lower(), value.lower())


def transport(spec: str) -> tuple[str, str]:
    """(description, config) for SIM_UCX_TRANSPORT: 'tcp', 'cuda_ipc', 'rc_mlx5/mlx5_0:1'."""
    tl, _, dev = spec.partition("/")
    tl = tl or "cuda_ipc"
    dev = dev or _DEFAULT_DEVICE.get(tl, "mlx5_0:1")
    desc = "software emulation" if tl == "tcp" else "zero-copy"
    return desc, f"{tl}/{dev}"


def table(ep_cfg: str, sel_param: str, rows: list[tuple[str, str, str]]) -> list[str]:
    """UCX 1.22's rendered protocol table (one string per line, no prefix)."""
    headers = ("Range", "Description", "Config")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    for title in (ep_cfg, sel_param):  # spanning cells widen the last column
        span = sum(widths) + 3 * (len(widths) - 1)
        if len(title) > span:
            widths[-1] += len(title) - span
    span = sum(widths) + 3 * (len(widths) - 1)
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def centred(text: str, w: int) -> str:
        pad = max(w - len(text), 0)
        return " " * (pad // 2) + text + " " * (pad - pad // 2)

    lines = [sep, f"| {ep_cfg:<{span}} |", f"| {sel_param:<{span}} |", sep,
             "".join(f"| {centred(h, w)} " for h, w in zip(headers, widths, strict=True)) + "|", sep]
    for rng, desc, cfg in rows:
        lines.append(f"| {rng:>{widths[0]}} | {desc:<{widths[1]}} | {cfg:<{widths[2]}} |")
    lines.append(sep)
    return lines


def compact_prefix(now: float | None = None, thread: str = "0") -> str:
    now = time.time() if now is None else now
    sec = int(now)
    usec = int(round((now - sec) * 1e6)) % 1_000_000
    return f"[{sec}.{usec:06d}] [{socket.gethostname()}:{os.getpid():<5d}:{thread}]   "


def get_report(spec: str, gpu: int, remote_dev: int, intra_node: bool) -> tuple[str, list[str]]:
    """(operation row, table lines) for a GET of GPU memory from a remote GPU."""
    ep_cfg = f"ucp_context_0 {'intra-node' if intra_node else 'inter-node'} cfg#1"
    sel_param = (f"remote memory read by ucp_get* into cuda/GPU{gpu} "
                 f"from cuda/dev[{remote_dev}]")
    desc, cfg = transport(spec)
    return sel_param, table(ep_cfg, sel_param, [("0..inf", desc, cfg)])


def report_once(key: object, spec: str, gpu: int, remote_dev: int, intra_node: bool,
                env: dict[str, str] | None = None,
                write: Callable[[str], None] | None = None) -> bool:
    """Print the table for ``key`` (an engine) the first time; True when printed."""
    if key in _reported:
        return False
    _reported.add(key)
    env = dict(os.environ) if env is None else env
    sel_param, lines = get_report(spec, gpu, remote_dev, intra_node)
    if not enabled(env, sel_param):
        return False
    prefix = compact_prefix()
    text = "".join(prefix + line + "\n" for line in lines)
    if write is None:
        import sys

        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write(text)
    return True


_reported: set[object] = set()
