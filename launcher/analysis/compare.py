"""Two runs side by side: what differs in what was asked for, in what ran, and in the
figures (`python -m launcher diff RUN_A RUN_B`).

- settings: the resolved recipes (recipe.yaml), key by key;
- processes: every process's argv (flag by flag) and environment from plan.json, with
  what differs by construction between any two runs left out (the run directory, ports,
  which the job id shifts, and node names when the allocation differs);
- fingerprint drift: engine version, image, every package of the engine's environment,
  torch's CUDA, driver and GPU models (run.json's identity), the launcher's version and
  commit (submission.json);
- per sweep point present in both: tok/s per working GPU, tok/s per user, TTFT and TPOT
  p50/p99, and accuracy, with the change in per cent.

A comparison is single-variable when exactly one setting differs and nothing drifted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from launcher.run.rundir import RunDir, read_json

FIGURES = {
    "total_tokens_per_s_per_gpu": "tok/s/working GPU",
    "tokens_per_s_per_user": "tok/s/user",
    "ttft_p50_ms": "TTFT p50 ms",
    "ttft_p99_ms": "TTFT p99 ms",
    "tpot_p50_ms": "TPOT p50 ms",
    "tpot_p99_ms": "TPOT p99 ms",
}
SAME_BY_NATURE = ("name", "description")  # a run's own name is not a setting
_PORT = re.compile(r":\d{2,5}\b")
_IPV4 = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b")


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _recipe(rd: RunDir) -> dict[str, Any]:
    import yaml

    try:
        doc = yaml.safe_load((rd.path / "recipe.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    flat = _flat(doc)
    return {k: _normal(v, rd) for k, v in flat.items() if k not in SAME_BY_NATURE}


def _normal(v: Any, rd: RunDir) -> Any:
    """A value with the run's own directory written as <RUN_DIR> (inputs are copied in)."""
    if isinstance(v, str):
        return v.replace(str(rd.path), "<RUN_DIR>")
    if isinstance(v, list):
        return [_normal(x, rd) for x in v]
    return v


def settings(a: RunDir, b: RunDir) -> list[tuple[str, Any, Any]]:
    ra, rb = _recipe(a), _recipe(b)
    return [(k, ra.get(k), rb.get(k)) for k in sorted(set(ra) | set(rb)) if ra.get(k) != rb.get(k)]


def _argv_map(argv: list[str]) -> dict[str, str]:
    """`--flag value` and `--flag` as {flag: value}; the words before the first flag as
    {"<command>": ...}."""
    out: dict[str, str] = {}
    i = 0
    head = []
    while i < len(argv) and not argv[i].startswith("--"):
        head.append(argv[i])
        i += 1
    out["<command>"] = " ".join(head)
    while i < len(argv):
        flag = argv[i]
        if "=" in flag:
            k, v = flag.split("=", 1)
            out[k] = v
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[flag] = argv[i + 1]
            i += 2
        else:
            out[flag] = ""
            i += 1
    return out


def _by_nature(key: str) -> bool:
    k = key.lower()
    return "port" in k or k.endswith(("_host", "-address", "_ip")) or k in ("--run-dir",)


def _key(name: str, nodes: list[str]) -> str:
    """A process by its part and the index of its node in the plan (node names differ
    between allocations)."""
    for i, n in enumerate(nodes):
        name = name.replace(f"@{n}", f"@<node{i}>")
    return name


def _clean(v: str, rd: RunDir, nodes: list[str]) -> str:
    v = _PORT.sub(":<port>", v.replace(str(rd.path), "<RUN_DIR>"))
    for i, n in enumerate(nodes):
        v = v.replace(n, f"<node{i}>")
    return _IPV4.sub("<node>", re.sub(r"<node\d+>", "<node>", v))


def processes(a: RunDir, b: RunDir) -> list[str]:
    pa, pb = read_json(a.plan) or {}, read_json(b.plan) or {}
    na = [n["name"] for n in pa.get("nodes") or []]
    nb = [n["name"] for n in pb.get("nodes") or []]
    by_a = {p["name"]: p for p in pa.get("processes") or []}
    by_b = {p["name"]: p for p in pb.get("processes") or []}
    # a process is its role and rank, not the node it landed on
    key_a = {_key(n, na): p for n, p in by_a.items()}
    key_b = {_key(n, nb): p for n, p in by_b.items()}
    out = []
    for name in sorted(set(key_a) | set(key_b)):
        x, y = key_a.get(name), key_b.get(name)
        if x is None or y is None:
            out.append(f"{name}: only in {'B' if x is None else 'A'}")
            continue
        for what, da, db in (("argv", _argv_map(x.get("argv") or []), _argv_map(y.get("argv") or [])),
                             ("env", x.get("env") or {}, y.get("env") or {})):
            for k in sorted(set(da) | set(db)):
                if _by_nature(k):
                    continue
                va, vb = da.get(k), db.get(k)
                va = None if va is None else _clean(str(va), a, na)
                vb = None if vb is None else _clean(str(vb), b, nb)
                if va != vb:
                    out.append(f"{name} {what} {k}: {va} -> {vb}")
    return out


def drift(a: RunDir, b: RunDir) -> list[tuple[str, Any, Any]]:
    ra, rb = a.read_record(), b.read_record()
    ia, ib = (ra.identity if ra else None) or {}, (rb.identity if rb else None) or {}
    out = []
    for key in ("engine", "engine_version", "image", "model", "model_revision", "torch_cuda",
                "driver", "gpu_models", "packages_differ_on"):
        if ia.get(key) != ib.get(key):
            out.append((key, ia.get(key), ib.get(key)))
    pa, pb = ia.get("packages") or {}, ib.get("packages") or {}
    for name in sorted(set(pa) | set(pb)):
        if pa.get(name) != pb.get(name):
            out.append((f"package {name}", pa.get(name), pb.get(name)))
    la, lb = a.read_submission().launcher, b.read_submission().launcher
    if la != lb:
        out.append(("launcher", la, lb))
    return out


def _points(rd: RunDir) -> dict[Any, dict]:
    s = read_json(rd.summary) or {}
    return {p.get("max_concurrency"): p for p in s.get("points") or [] if isinstance(p, dict)}


def figures(a: RunDir, b: RunDir) -> list[dict[str, Any]]:
    pa, pb = _points(a), _points(b)
    rows = []
    for c in sorted(set(pa) & set(pb), key=lambda c: (c is None, c or 0)):
        for key, label in FIGURES.items():
            va, vb = pa[c].get(key), pb[c].get(key)
            if isinstance(va, int | float) and isinstance(vb, int | float):
                change = (vb - va) / va * 100 if va else None
                rows.append({"concurrency": c, "figure": label, "a": va, "b": vb,
                             "change_pct": change})
    for rd_key, (x, y) in {"accuracy": ((read_json(a.summary) or {}).get("accuracy"),
                                        (read_json(b.summary) or {}).get("accuracy"))}.items():
        if isinstance(x, dict) and isinstance(y, dict):
            va, vb = x.get("accuracy"), y.get("accuracy")
            if isinstance(va, int | float) and isinstance(vb, int | float):
                rows.append({"concurrency": None, "figure": f"{rd_key} ({x.get('harness')} / "
                             f"{y.get('harness')} harness)", "a": va, "b": vb,
                             "change_pct": (vb - va) / va * 100 if va else None})
    return rows


def compare(a: Path, b: Path) -> dict[str, Any]:
    ra, rb = RunDir(Path(a)), RunDir(Path(b))
    sets, drifted = settings(ra, rb), drift(ra, rb)
    return {"a": str(ra.path), "b": str(rb.path), "settings": sets,
            "processes": processes(ra, rb), "drift": drifted, "figures": figures(ra, rb),
            "single_variable": len(sets) == 1 and not drifted,
            "spread": None}  # run-to-run spread: not known from two runs


def _show(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def text(r: dict[str, Any]) -> str:
    out = [f"A {r['a']}", f"B {r['b']}"]
    sets, drifted = r["settings"], r["drift"]
    if r["single_variable"]:
        out.append(f"single-variable: only {sets[0][0]} differs, and nothing drifted")
    elif not sets and not drifted:
        out.append("a repeat: no setting differs and nothing drifted (what differs in the "
                   "figures is run-to-run)")
    else:
        why = []
        if len(sets) != 1:
            why.append(f"{len(sets)} settings differ")
        if drifted:
            why.append(f"{len(drifted)} fingerprint item(s) drifted")
        out.append("NOT single-variable: " + ", ".join(why))
    out.append("settings (resolved recipe):" if sets else "settings: the same")
    out += [f"  {k}: {_show(x)} -> {_show(y)}" for k, x, y in sets]
    procs = r["processes"]
    out.append("processes (argv, environment):" if procs else
               "processes: the same argv and environment (ports, run directory and node "
               "names aside)")
    out += [f"  {line}" for line in procs[:60]]
    if len(procs) > 60:
        out.append(f"  ... and {len(procs) - 60} more")
    out.append("fingerprint drift:" if drifted else "fingerprint: no drift")
    out += [f"  {k}: {_show(x)} -> {_show(y)}" for k, x, y in drifted]
    rows = r["figures"]
    out.append("figures (B against A; run-to-run spread unknown from one run each):" if rows
               else "figures: no sweep point in both")
    for row in rows:
        where = "" if row["concurrency"] is None else f"c={row['concurrency']} "
        ch = "" if row["change_pct"] is None else f" ({row['change_pct']:+.1f} %)"
        out.append(f"  {where}{row['figure']}: {row['a']:,.4g} -> {row['b']:,.4g}{ch}")
    return "\n".join(out)
