"""``python -m launcher.sim serve MODEL [vllm serve flags]``: a simulated vLLM server."""

from launcher.sim.main import main

raise SystemExit(main())
