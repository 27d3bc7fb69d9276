"""Each engine's `vllm serve` command line, read by vLLM's own flag table before submitting.

The table (``launcher.sim.vllm_flags``) is vLLM 0.33.0's parser; a recipe for that version
(or with none named) gets every unknown flag, bad value and bad choice refused at dry-run,
in vLLM's words, with the recipe key to fix. Other versions are left to the preflight, which
runs the real container's parser on the nodes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from launcher.errors import UserError
from launcher.schema.sections import flag_key
from launcher.schema.wording import did_you_mean, show

if TYPE_CHECKING:
    from launcher.planning.plan import Plan


def table_version() -> str:
    from launcher.sim import vllm_flags

    return vllm_flags.VLLM_VERSION


def applies(plan: Plan) -> bool:
    """Whether the table is the version the recipe's engine runs."""
    want = plan.recipe.engine_kind.expected_version(plan.recipe.engine_version)
    if not want:
        return True
    return table_version().startswith(want) or want.startswith(table_version())


def _flag_names(option: str) -> list[str]:
    return [option.lstrip("-"), flag_key(option)]


def _source(plan: Plan, role: str, flag: str, concurrency: int | None = None) -> str:
    """The recipe key that put ``--flag`` on the command line (at a restart's concurrency,
    its args_from_concurrency step first)."""
    r = plan.recipe
    name = flag.lstrip("-")
    base = name.removeprefix("no-")
    pool = getattr(r, role)
    places = [(f"{role}.args_from_concurrency.{c}", pool.args_from_concurrency[c])
              for c in sorted(pool.args_from_concurrency, reverse=True)
              if concurrency is not None and c <= concurrency]
    places += [(f"{role}.args", pool.args), ("vllm_args", r.vllm_args)]
    for where, args in places:
        for key in args:
            if flag_key(key) in (name, base):
                return f"{where}.{key}"
    if base == "kv-transfer-config":
        return "kv_connector"
    return ""


def _first_flag(message: str) -> str | None:
    m = re.search(r"(?:argument|ambiguous option:) (--[A-Za-z0-9_.-]+)", message)
    return m.group(1) if m else None


def _one_line(text: str) -> str:
    """argparse's error without its usage lines; a pydantic report folded into one line."""
    lines = text.strip().splitlines()
    if not lines:
        return "it exits with no message"
    at = next((i for i, line in enumerate(lines) if ": error: " in line), len(lines) - 1)
    msg = lines[at].split(": error: ", 1)[-1]
    rest = [re.sub(r"\s*\[type=[^\]]*\]", "", line).strip() for line in lines[at + 1:]]
    rest = [x for x in rest if x and not x.startswith("For further information")]
    return msg + (f" ({' '.join(rest)})" if rest else "")


def _options(argv: list[str]) -> list[str]:
    """The option names on a command line (a value, even one with '-' after '=', is not)."""
    return [a.split("=", 1)[0] for a in argv if a.startswith("-")]


def _flag_before(argv: list[str], word: str) -> str | None:
    at = argv.index(word) if word in argv else 0
    return argv[at - 1] if at > 0 and argv[at - 1].startswith("--") else None


def _help_options(argv: list[str]) -> list[str]:
    """The options argparse reads as its own -h/--help (an unambiguous prefix too)."""
    from launcher.sim import argv as vllm_argv

    serve = vllm_argv._plain()[1]
    names = [o for o in serve._option_string_actions if o.startswith("--")]
    return [o for o in _options(argv) if o == "-h" or o == "--help" or (
        o.startswith("--") and [n for n in names if n.startswith(o)] == ["--help"])]


def _refusal(argv: list[str]) -> str | None:
    """vLLM's own words for why it would not serve with this argv (None: it would)."""
    from launcher.sim import argv as vllm_argv

    try:
        vllm_argv.parse(argv, warn=lambda w, m: None)
    except vllm_argv.VllmArgError as e:
        if e.code == 0:  # help or version: printed, then exit 0 without serving
            return "it would print its help and exit without serving"
        return _one_line(e.text)
    except vllm_argv.VllmStartupError as e:
        return str(e)
    return None


def problems(plan: Plan) -> list[str]:
    """One sentence per refusal, naming the engines whose argv vLLM would refuse (one of each
    kind is read: role, head or headless part; as each starts and at each restart) and the
    recipe key to fix."""
    numa = _numa_bind_nodes(plan)  # vLLM's meaning of the flag, whatever parser checks it
    if not applies(plan):
        return numa
    from launcher.planning import render
    from launcher.sim import vllm_flags

    if plan.recipe.mode == "disagg" and (bad := _kv_config_problems(plan.recipe.kv_connector)):
        return numa + bad
    if bad := _abbreviations(plan):
        return numa + bad
    if bad := _lists_for_one_value(plan):
        return numa + bad
    known = [o for rec in vllm_flags.FLAGS for o in rec["options"]]
    found: dict[str, list[str]] = {}
    seen = set()
    for ep in plan.endpoints:
        for part in ep.parts:
            kind = (ep.role, part.head, part.http_port is None)
            if kind in seen:
                continue
            seen.add(kind)
            start = render.serve_argv(plan, ep, part)
            lines = [(None, start)] + [(r["from_concurrency"], r["argv"])
                                       for r in render.restarts(plan, ep, part, start)]
            for at, full in lines:
                argv = full[full.index("serve"):]
                msg = _refusal(argv)
                if msg is None:
                    continue
                given = _options(argv)
                if msg.startswith("it would print its help"):
                    wrong = _help_options(argv)
                elif "unrecognized arguments" in msg:
                    words = msg.split("unrecognized arguments:", 1)[1].split()
                    # a value right after an unrecognized flag is that flag's
                    words = [w for i, w in enumerate(words)
                             if w.startswith("-") or i == 0 or not words[i - 1].startswith("--")]
                    wrong = [w.split("=", 1)[0] for w in words]
                    # a value left over (a flag that takes none) is named by its flag
                    wrong = [w if w in given else _flag_before(argv, w) for w in wrong]
                    wrong = list(dict.fromkeys(w for w in wrong if w in given))
                else:
                    wrong = [f] if (f := _first_flag(msg)) else []
                fixes = []
                for flag in wrong:
                    where = _source(plan, str(ep.role), flag, at) or f"the launcher's {flag}"
                    hint = "" if "unrecognized" not in msg else did_you_mean(flag, known) \
                        if flag not in known else f"{flag} takes no value"
                    fixes.append(f"fix {where}" + (f" ({hint})" if hint else ""))
                text = f"{msg}: {', '.join(fixes) or 'fix the recipe'}"
                who = ep.name + ("" if part.head else " (headless part)"
                                 if part.http_port is None else " (front on another node)")
                found.setdefault(text, []).append(
                    who + (f" as it restarts before concurrency {at}" if at else ""))
                break  # a start it refuses: its restarts are not reached
    return numa + [f"`vllm serve` {table_version()} would refuse the command line of "
                   f"{', '.join(who)}: {text}" for text, who in found.items()]


def _lists_for_one_value(plan: Plan) -> list[str]:
    """A list (several values after the flag) for a flag of the table that takes one: named
    by its key, not by the stray value argparse reports after some other flag."""
    from launcher.sim import vllm_flags

    takes = {o: rec.get("nargs") for rec in vllm_flags.FLAGS for o in rec["options"]}
    out = []
    for where, args in plan.recipe.engine_arg_sources():
        for key, value in args.items():
            flag = "--" + flag_key(key)
            if isinstance(value, list) and flag in takes and takes[flag] not in ("+", "*"):
                out.append(f"{where}.{key} lists {len(value)} values, but vLLM "
                           f"{table_version()}'s {flag} takes one: write one value")
    return out


def _numa_bind_nodes(plan: Plan) -> list[str]:
    """numa-bind-nodes names one NUMA node per GPU the process sees (vLLM's ParallelConfig;
    numa_utils indexes it by the GPU's local index, so a shorter list fails the engine at
    start; a longer one runs, its first entries read): its length against each engine
    part's GPUs."""
    out = []
    for role, pool in plan.recipe.pools():
        for at, args in [(None, plan.recipe.vllm_args | pool.args)] + [
                (c, plan.recipe.vllm_args | pool.args_at(c))
                for c in sorted(pool.args_from_concurrency)]:
            nodes = next((v for k, v in args.items() if flag_key(k) == "numa-bind-nodes"), None)
            if not isinstance(nodes, list):
                continue
            seen = sorted({len(part.gpus) for ep in plan.endpoints if str(ep.role) == str(role)
                           for part in ep.parts})
            wrong = [n for n in seen if n > len(nodes)]
            if wrong:
                where = _source(plan, str(role), "--numa-bind-nodes", at) or "numa-bind-nodes"
                out.append(f"{where} lists {len(nodes)} NUMA node(s), but each {role} engine "
                           f"process sees {' or '.join(map(str, seen))} GPU(s): list one node "
                           "per GPU it sees")
                break
    return out


def _abbreviations(plan: Plan) -> list[str]:
    """Recipe keys that are a prefix of one vLLM flag: vLLM takes them as that flag
    (argparse's allow_abbrev), but the launcher reads flags by their full name (the KV
    estimate, P/D agreement), so the two would disagree on what the engine runs with."""
    from launcher.sim import argv as vllm_argv

    names = set(vllm_argv._plain()[1]._option_string_actions) - {"-h", "--help"}  # below
    out = []
    for where, args in plan.recipe.engine_arg_sources():
        for key in args:
            flag = "--" + flag_key(key).split(".", 1)[0]
            longer = [n for n in names if n.startswith(flag)] if flag not in names else []
            if len(longer) == 1:
                out.append(f"{where}.{key} is short for {longer[0]}: vLLM {table_version()} "
                           f"would take it as that flag, the launcher's checks read the full "
                           f"name; did you mean {longer[0]!r}?")
    return out


def _kv_config_problems(kv: dict) -> list[str]:
    """kv_connector's keys and choices as vLLM's KVTransferConfig takes them (it forbids
    unknown keys: the engine would exit at start-up), in the recipe's words."""
    from launcher.sim import vllm_flags

    spec = vllm_flags.CONFIG_CLASSES["KVTransferConfig"]
    out = []
    for key, value in kv.items():
        if key not in spec["fields"]:
            hint = did_you_mean(key, spec["fields"])
            out.append(f"kv_connector.{key} is not a key of vLLM {table_version()}'s KV-transfer "
                       f"config" + (f": {hint}" if hint else
                                    f"; it takes {', '.join(spec['fields'])}"))
        elif key in spec["literals"] and value not in spec["literals"][key]:
            choices = ", ".join(repr(c) for c in spec["literals"][key] if c is not None)
            out.append(f"kv_connector.{key} must be one of {choices} (got {value!r})")
    return out


def checked_by(plan: Plan) -> str:
    """Which parser reads the engines' flags, in one line of the dry-run."""
    r = plan.recipe
    if not r.engine_kind.checks_version:  # no image of its own to check them again
        return (f"Engine flags: checked by vLLM {table_version()}'s parser (the simulator's), "
                "before anything is written")
    if applies(plan):
        return (f"Engine flags: checked by vLLM {table_version()}'s parser before anything is "
                "written, and again by the image's own parser in the preflight")
    return (f"Engine flags: vLLM {r.engine_version} (engine_version) is not the "
            f"{table_version()} parser the dry-run has: the preflight checks them with the "
            "image's own parser on the nodes, before any engine starts")


def check(plan: Plan) -> None:
    found = problems(plan)
    if found:
        raise UserError.of("vLLM would refuse the engines' command lines:", found)


# Values no vLLM version takes, read without the image's parser: (flag, kind) where kind is
# "count" (a whole number >= 1), "size" (the same, or vLLM's "16k"/"1M" forms), "length"
# (a size, or -1/auto for the model's own) or "fraction" (a number in (0, 1]).
PORTABLE_VALUES = {
    "max-num-seqs": "count", "tensor-parallel-size": "count", "data-parallel-size": "count",
    "data-parallel-size-local": "count", "pipeline-parallel-size": "count",
    "block-size": "count", "api-server-count": "count", "num-gpu-blocks-override": "count",
    "max-num-batched-tokens": "size", "kv-cache-memory-bytes": "size",
    "max-model-len": "length", "gpu-memory-utilization": "fraction",
}
# The flags the launcher itself reads from a recipe (the KV estimate, P/D agreement): a
# misspelling of one would leave the plan without it.
READ_BY_LAUNCHER = (
    *PORTABLE_VALUES, "kv-cache-dtype", "mamba-ssm-cache-dtype", "mamba-cache-dtype",
    "enable-prefix-caching", "speculative-config", "attention-config", "async-scheduling",
    "enforce-eager", "language-model-only", "gdn-prefill-backend", "attention-backend",
    "enable-expert-parallel", "kv-transfer-config",
)


def _whole(v: object, *, sizes: bool) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            if sizes:
                from launcher.sim.argv import human_readable_int

                return human_readable_int(v)
            return int(v.strip())
        except (ValueError, TypeError, ArithmeticError):  # argparse's type error included
            return None
    return None


def _value_problem(where: str, kind: str, v: object) -> str | None:
    got = f"(got {show(repr(v), 60)})"
    if isinstance(v, list):
        return (f"{where} lists {len(v)} values, but --{where.rsplit('.', 1)[-1]} takes one "
                f"{got}: vLLM refuses it")
    if kind == "fraction":
        ok = not isinstance(v, bool) and isinstance(v, int | float | str)
        try:
            x = float(v) if ok else None  # type: ignore[arg-type]
        except ValueError:
            x = None
        if x is None or not 0 < x <= 1:
            return (f"{where} must be a fraction of the GPU's memory above 0 and at most 1 "
                    f"{got}: vLLM refuses any other value")
        return None
    if kind == "length" and (v == -1 or str(v).strip().lower() in ("-1", "auto")):
        return None
    n = _whole(v, sizes=kind != "count")
    if n is None or n < 1:
        also = " (or -1/auto for the model's own)" if kind == "length" else \
            " (or a size like 16k)" if kind == "size" else ""
        return f"{where} must be a whole number of 1 or more{also} {got}: vLLM refuses it"
    return None


def value_problems(recipe) -> list[str]:
    """What no vLLM takes, whichever the image holds, one sentence each naming the recipe
    key: Dynamo's own options, values out of every version's range, and (where the flag
    table is not the image's vLLM) a misspelling of a flag the launcher reads."""
    from launcher.sim import vllm_flags

    known = {o.lstrip("-") for rec in vllm_flags.FLAGS for o in rec["options"]}
    want = recipe.engine_kind.expected_version(recipe.engine_version)
    table = not want or table_version().startswith(want) or want.startswith(table_version())
    out = []
    for where, args in recipe.engine_arg_sources():
        for key, v in args.items():
            name, at = flag_key(key), f"{where}.{key}"
            if name.startswith("dyn-"):
                out.append(f"{at} is an option of Dynamo (its frontend and worker, "
                           "`python -m dynamo.vllm`), not of `vllm serve`, which this launcher "
                           "runs behind vllm-router: remove it")
            elif name in PORTABLE_VALUES:
                if (bad := _value_problem(at, PORTABLE_VALUES[name], v)) is not None:
                    out.append(bad)
            elif not table and name not in known and name.removeprefix("no-") not in known \
                    and (hint := did_you_mean(name, READ_BY_LAUNCHER)):
                out.append(f"{at} is not a vLLM flag the launcher knows, {hint} (the plan "
                           "reads that one; misspelt, the plan and the engine would disagree)")
    return out


def check_values(recipe) -> None:
    found = value_problems(recipe)
    if found:
        raise UserError.of("the recipe's engine flags:", found)
