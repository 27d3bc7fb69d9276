"""Record what vLLM's own `vllm serve` parser prints for a set of argvs (a golden file).

Runs each argv of ``tests/data/vllm_argv_cases.json`` ("cases") through the parser that
``extract_vllm_serve_flags.py`` builds from an installed vLLM (same setup as there) and
writes back, per case, the exit status and the exact stderr text (COLUMNS=80, as in a batch
job). ``tests/test_sim_vllm_argv.py`` checks that launcher.sim prints the same::

    COLUMNS=80 /tmp/v/bin/python tests/tools/record_vllm_argv_cases.py
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm_argv_cases.json"


def main() -> None:
    spec = importlib.util.spec_from_file_location(
        "extract", Path(__file__).with_name("extract_vllm_serve_flags.py")
    )
    assert spec and spec.loader
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    ex._platform()
    top, _ = ex._build()
    data = json.loads(DATA.read_text())
    out = []
    for case in data["cases"]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                top.parse_args(list(case["argv"]))
                code = 0
            except SystemExit as exc:
                code = exc.code
        out.append({"argv": case["argv"], "exit": code, "stderr": err.getvalue()})
    data["vllm"] = ex._dist_version()
    data["python"] = sys.version.split()[0]
    data["cases"] = out
    DATA.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
