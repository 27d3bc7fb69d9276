"""Which published benchmark a custom command (benchmark.custom) is, when it is one the
launcher runs itself, and the `--set`s that run it natively (docs/custom-benchmark.md).

Pure: the command and its env are read as text, nothing is run.
- InferenceX's fixed-length wrapper `benchmarks/multi_node/srt_bench.sh` (its settings in
  the env: ISL, OSL, CONCURRENCIES or CONC_LIST, RANDOM_RANGE_RATIO, NUM_PROMPTS_MULT,
  NUM_WARMUP_MULT, USE_CHAT_TEMPLATE) and a command that calls InferenceX's
  `utils/bench_serving/benchmark_serving.py` itself (its flags on the command line): both
  send sa-bench's workload, which the builtin sweep sends.
- InferenceX's agentic AIPerf replay (`agentic_srt.sh`, `srt_agentic.sh`, srt-slurm's
  `agentx.sh`): the srt-slurm import makes it benchmark.agentic; written by hand as
  benchmark.custom, it runs as given.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

# srt_bench.sh's defaults (InferenceX benchmarks/multi_node/srt_bench.sh, read 2026-12-06)
SRT_BENCH_DEFAULTS = {"RANDOM_RANGE_RATIO": "0.8", "NUM_PROMPTS_MULT": "10",
                      "NUM_WARMUP_MULT": "2", "USE_CHAT_TEMPLATE": "true"}
AGENTIC_SCRIPTS = ("agentic_srt.sh", "srt_agentic.sh", "agentx.sh", "agentic_replay")
INFERENCEX_CLIENT = "bench_serving/benchmark_serving.py"


@dataclass(frozen=True)
class Native:
    what: str  # which published benchmark the command is
    sets: list[str] = field(default_factory=list)  # --set key=value that run it natively
    missing: list[str] = field(default_factory=list)  # settings the command does not give
    runs_natively: bool = True

    def text(self) -> str:
        if not self.runs_natively:
            return (f"This is {self.what}, which benchmark.agentic runs natively with the "
                    "real AIPerf (docs/agentic.md): an srt-slurm recipe's command is "
                    "imported as it; here the command runs as given.")
        sets = " ".join(f"--set {shlex.quote(s)}" for s in ["benchmark.custom=null", *self.sets])
        gap = (f" (give {', '.join(self.missing)} too: the command takes them from the "
               "environment InferenceX's workflow exports)" if self.missing else "")
        return (f"This is {self.what}, which the builtin sweep sends natively (sa-bench's "
                f"lengths and warm-up, per-point results, the dashboard): {sets}{gap}")


def is_agentic(command) -> bool:
    """The command is InferenceX's agentic AIPerf replay (the import makes it
    benchmark.agentic)."""
    return isinstance(command, str) and any(s in command for s in AGENTIC_SCRIPTS)


def recognise(command: str, env: dict[str, str]) -> Native | None:
    """The published benchmark `command` (with `env`) is, or None."""
    if any(s in command for s in AGENTIC_SCRIPTS):
        return Native("InferenceX's agentic AIPerf replay", runs_natively=False)
    if "srt_bench.sh" in command:
        return _srt_bench(env)
    if INFERENCEX_CLIENT in command:
        return _inline_client(command)
    return None


def _concurrencies(text: str) -> list[int] | None:
    parts = [p for p in re.split(r"[x,\s]+", text.strip()) if p]
    return [int(p) for p in parts] if parts and all(p.isdigit() for p in parts) else None


def _srt_bench(env: dict[str, str]) -> Native:
    e = {**SRT_BENCH_DEFAULTS, **env}
    sets, missing = [], []
    for key, target in (("ISL", "benchmark.input_len"), ("OSL", "benchmark.output_len")):
        if e.get(key, "").isdigit():
            sets.append(f"{target}={e[key]}")
        else:
            missing.append(target)
    conc = _concurrencies(e.get("CONCURRENCIES") or e.get("CONC_LIST") or "")
    if conc:
        sets.append(f"benchmark.concurrency=[{','.join(map(str, conc))}]")
    else:
        missing.append("benchmark.concurrency")
    sets += ["benchmark.length_rule=sa-bench", f"benchmark.range_ratio={e['RANDOM_RANGE_RATIO']}",
             f"benchmark.prompts_multiplier={e['NUM_PROMPTS_MULT']}",
             "benchmark.warmup=0", f"benchmark.warmup_multiplier={e['NUM_WARMUP_MULT']}",
             f"benchmark.chat_template={str(e['USE_CHAT_TEMPLATE'] == 'true').lower()}"]
    return Native("InferenceX's fixed-length sa-bench wrapper (srt_bench.sh)", sets, missing)


def _inline_client(command: str) -> Native:
    """InferenceX's benchmark_serving.py called in the command: its flags, with a value that
    is a shell variable looked up in the command's own `name=value` lines."""
    assigned = dict(re.findall(r"(?m)^\s*([A-Za-z_]\w*)=(.+?)\s*$", command))
    line = next(ln for ln in command.replace("\\\n", " ").splitlines() if INFERENCEX_CLIENT in ln)
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        words = line.split()
    opts: dict[str, str | bool] = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            name, eq, val = w.partition("=")
            nxt = words[i + 1] if i + 1 < len(words) else ""
            opts[name] = val if eq else (nxt if nxt and not nxt.startswith("--") else True)

    def value(flag: str) -> str | None:
        v = opts.get(flag)
        if not isinstance(v, str):
            return None
        m = re.fullmatch(r"\$\{?(\w+)\}?", v)
        return assigned.get(m[1]) if m else v

    def multiple(flag: str) -> str | None:
        """$((concurrency * N)) as N, where the point's concurrency is the variable."""
        v = opts.get(flag)
        m = re.fullmatch(r"\$\{?(\w+)\}?", v) if isinstance(v, str) else None
        rhs = assigned.get(m[1], "") if m else ""
        conc = re.fullmatch(r"\$\{?(\w+)\}?", str(opts.get("--max-concurrency", "")))
        mm = re.fullmatch(r"\$\(\((\w+)\s*\*\s*(\d+)\)\)", rhs.strip("\"'"))
        return mm[2] if mm and conc and mm[1] == conc[1] else None

    sets, missing = [], []
    for flag, target in (("--random-input-len", "benchmark.input_len"),
                         ("--random-output-len", "benchmark.output_len")):
        v = value(flag)
        if v and v.isdigit():
            sets.append(f"{target}={v}")
        else:
            missing.append(target)
    conc = _concurrencies(value("--max-concurrency") or "")
    if conc:
        sets.append(f"benchmark.concurrency=[{','.join(map(str, conc))}]")
    else:
        missing.append("benchmark.concurrency")
    sets.append("benchmark.length_rule=sa-bench")
    if (r := value("--random-range-ratio")) and re.fullmatch(r"[0-9.]+", r):
        sets.append(f"benchmark.range_ratio={r}")
    if n := multiple("--num-prompts"):
        sets.append(f"benchmark.prompts_multiplier={n}")
    if n := multiple("--num-warmups"):  # in place of a fixed warm-up count
        sets += ["benchmark.warmup=0", f"benchmark.warmup_multiplier={n}"]
    sets.append(f"benchmark.chat_template={str('--use-chat-template' in opts).lower()}")
    return Native("InferenceX's sa-bench client (utils/bench_serving/benchmark_serving.py)",
                  sets, missing)
