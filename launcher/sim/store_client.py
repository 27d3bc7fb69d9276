"""The simulated engine's Mooncake store client: a small process run with the Python that has
Mooncake's own client (``mooncake.store.MooncakeDistributedStore``, from the
mooncake-transfer-engine wheel), which is not the simulator's Python (docs/sim-kv-tiers.md).

It imports nothing of the launcher, so any Python with ``mooncake.store`` runs it:
``PYTHON store_client.py``. Protocol: one JSON object a line on stdin, one answer a line on
stdout, matched by ``id``. The first line is the set-up (the arguments vLLM passes to
``store.setup``); then operations on keys:

- ``{"id", "op": "exist", "keys"}`` -> ``{"id", "result": [1|0|<0 per key], "s"}``
- ``{"id", "op": "put", "keys", "size"}`` -> one return code per key (0: stored)
- ``{"id", "op": "get", "keys", "size"}`` -> 1 per key read back whole and its own, else 0

A value is ``size`` bytes that start with its key, so a get checks it read that block.
Each answer has ``s``: the seconds the store call took. An exception is ``{"id", "error"}``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def _value(key: str, size: int) -> bytes:
    head = key.encode()[:size]
    return head + bytes(size - len(head))


def _get(store, keys: list[str], size: int) -> list[int]:
    out = []
    for key in keys:
        data = store.get(key)
        head = key.encode()[:size]
        out.append(1 if len(data) == size and bytes(data[:len(head)]) == head else 0)
    return out


def main() -> int:
    # The answers get their own descriptor; whatever the library writes to stdout goes to
    # stderr (the engine's log), so it can never be taken for an answer.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from mooncake.store import MooncakeDistributedStore

    setup = json.loads(sys.stdin.readline())
    store = MooncakeDistributedStore()
    rc = store.setup(setup["local_hostname"], setup["metadata_server"],
                     int(setup["global_segment_size"]), int(setup["local_buffer_size"]),
                     setup["protocol"], setup["device_name"], setup["master_server_address"])
    answers.write(json.dumps({"id": 0, "result": rc}) + "\n")
    answers.flush()
    if rc != 0:
        return 1
    lock = threading.Lock()

    def answer(msg: dict) -> None:
        start = time.perf_counter()
        try:
            keys, op = msg["keys"], msg["op"]
            if op == "exist":
                result = list(store.batch_is_exist(keys))
            elif op == "put":
                value = msg["size"]
                result = [store.put(k, _value(k, value)) for k in keys]
            elif op == "get":
                result = _get(store, keys, msg["size"])
            else:
                raise ValueError(f"unknown operation {op!r}")
            out = {"id": msg["id"], "result": result, "s": time.perf_counter() - start}
        except Exception as exc:  # the engine counts the operation as an error
            out = {"id": msg.get("id"), "error": f"{type(exc).__name__}: {exc}",
                   "s": time.perf_counter() - start}
        line = json.dumps(out)
        with lock:
            answers.write(line + "\n")
            answers.flush()

    # A few threads: a lookup need not wait behind a long put (the store client is
    # thread-safe; vLLM calls it from its worker's threads too).
    with ThreadPoolExecutor(4) as pool:
        for line in sys.stdin:
            if line.strip():
                pool.submit(answer, json.loads(line))
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
