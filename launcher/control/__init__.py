"""Control (effects): prepare, submit, the orchestrator, process backends, preflight, runs."""
