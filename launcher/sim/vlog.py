"""vLLM's log record layout: ``(Proc pid=N) LEVEL MM-DD HH:MM:SS [file.py:NNN] message``.

The layout (no year, no milliseconds, local time, optional VLLM_LOGGING_PREFIX) is what
vLLM 0.33's formatter prints with colours off; stats lines use the same file names and
line numbers as the fixtures so parsers see no difference.
"""

from __future__ import annotations

import os
import sys
import time

PROCESS_NAME = "APIServer"
_PREFIX = os.environ.get("VLLM_LOGGING_PREFIX", "")
_DEBUG = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() == "DEBUG"


def set_process_name(name: str) -> None:
    global PROCESS_NAME
    PROCESS_NAME = name


def line(level: str, where: str, msg: str, proc: str | None = None,
         now: float | None = None) -> str:
    ts = time.strftime("%m-%d %H:%M:%S", time.localtime(now if now is not None else time.time()))
    return f"{_PREFIX}({proc or PROCESS_NAME} pid={os.getpid()}) {level} {ts} [{where}] {msg}\n"


def log(level: str, where: str, msg: str, proc: str | None = None) -> None:
    if level == "DEBUG" and not _DEBUG:
        return
    sys.stdout.write(line(level, where, msg, proc))
    sys.stdout.flush()


def record(level: str, where: str, lines: list[str], proc: str | None = None) -> None:
    """A multi-line record as vLLM's NewLineFormatter writes it: the prefix on every line."""
    sys.stdout.write("".join(line(level, where, m, proc) for m in lines))
    sys.stdout.flush()


def info(where: str, msg: str, proc: str | None = None) -> None:
    log("INFO", where, msg, proc)


def warning(where: str, msg: str, proc: str | None = None) -> None:
    log("WARNING", where, msg, proc)


def error(where: str, msg: str, proc: str | None = None) -> None:
    log("ERROR", where, msg, proc)
