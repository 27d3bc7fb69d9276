"""Simulated vLLM 0.33 engine: same argv, HTTP API, P/D protocol, /metrics and stats logs.

Start it with the argv of ``vllm serve`` and only the executable swapped::

    python -m launcher.sim serve MODEL [vllm serve flags] [--sim-* flags]
    python -m launcher.sim serve MODEL --sim-help      # the SIM_* knobs and their docs

Simulation knobs are SIM_* env vars or --sim-* flags, defined in ``launcher.sim.knobs``.
Modules: ``cli`` (argv -> SimConfig), ``argv`` (a parser as strict as vLLM 0.33's, from the
flag table ``vllm_flags``), ``loading`` (vLLM's checkpoint-loading lines), ``ucx`` (UCX's
protocol table with UCX_PROTO_INFO=y), ``engine`` (per-DP-rank scheduler and speed model),
``server`` (OpenAI-compatible HTTP API), ``nixl`` (side channel and KV pull), ``dp``
(multi-node head/headless), ``metrics`` (/metrics), ``statslog`` (periodic log lines),
``answers`` (GSM8K answer key). Starting sims as processes for tests and benchmarks is test
support: tests/simprocs.py.
Nothing heavy is imported here, so the launcher CLI stays light.
"""

SIM_HEADER = "x-simulated-engine"
SIM_HEADER_VALUE = "launcher.sim"
