"""Simulated vLLM 0.33 engine: same argv, HTTP API, P/D protocol, /metrics and stats logs.

Start it with the argv of ``vllm serve`` and only the executable swapped::

    python -m launcher.sim serve MODEL [vllm serve flags] [--sim-* flags]

Simulation knobs are SIM_* env vars (see ``launcher.sim.knobs``). Nothing heavy is
imported here, so the launcher CLI stays light.
"""

SIM_HEADER = "x-simulated-engine"
SIM_HEADER_VALUE = "launcher.sim"
