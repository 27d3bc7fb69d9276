"""Disaggregated prefill/decode vLLM on Slurm: recipe -> plan -> render -> submit -> orchestrate."""
