"""srt-slurm recipes, imported: each published GB200 vLLM disaggregated recipe of
NVIDIA/srt-slurm-recipes (the copies in launcher/data/srt-slurm-recipes) is taken by
`submit` as it is, and its dry-run carries every flag of each role's vllm_config and every
environment variable onto that role's command lines in commands.sh, with the GPU and node
counts and the concurrency list of the source. What the import cannot take is refused in one
sentence naming the key. The expectations are read from the source files, not kept by hand."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from launcher.control import prepare
from launcher.errors import UserError
from launcher.schema import srt_slurm
from launcher.schema.wording import PROBLEMS_SEP

BUNDLED = srt_slurm.BUNDLED
SOURCES = sorted(p for p in (BUNDLED / "recipes").rglob("*.yaml")
                 if yaml.safe_load(p.read_text())["backend"]["type"] == "vllm")
# srtslurm.yaml aliases a site resolves; the import asks for them by name
ALIASES = {"minimax-m2.5-fp8": "MiniMaxAI/MiniMax-M2.5"}


def short(p: Path) -> str:
    return str(p.relative_to(BUNDLED / "recipes" / "multi-node"))


def test_every_published_gb200_vllm_disagg_recipe_is_here():
    families = {short(p).split("/")[0] for p in SOURCES}
    assert len(SOURCES) == 45, len(SOURCES)
    assert families == {"Qwen3.5", "DeepSeek-V4-Pro", "Kimi-K2.5", "MiniMax-M2.5"}


def overrides_for(src: dict) -> list[str]:
    path = src["model"]["path"]
    return [f"model.path={ALIASES[path]}"] if path in ALIASES else []


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """{source: (source mapping, plan.json with recipe.yaml as "recipe", commands.sh)}: every source through `submit`'s
    own loading (prepare.prepare_all, as `submit FILE --dry-run`)."""
    runs_dir = tmp_path_factory.mktemp("runs")
    out = {}
    for p in SOURCES:
        src = yaml.safe_load(p.read_text())
        [run] = prepare.prepare_all(str(p), overrides_for(src), [], runs_dir)
        doc = json.loads((run.run.path / "plan.json").read_text())
        doc["recipe"] = yaml.safe_load((run.run.path / "recipe.yaml").read_text())
        out[short(p)] = (src, doc, (run.run.path / "commands.sh").read_text())
    return out


def engine_lines(commands: str, role: str) -> list[list[str]]:
    """The words of each engine step of `role` in commands.sh."""
    lines = commands.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith(f"# {role}-") and "(engine)" in line:
            step = next(x for x in lines[i + 1:] if not x.startswith("#"))
            out.append(shlex.split(step))
    return out


def serve_flags(words: list[str]) -> dict[str, object]:
    i = words.index("serve")
    rest = words[i + 2:]
    flags: dict[str, object] = {}
    for k, w in enumerate(rest):
        if w.startswith("--"):
            nxt = rest[k + 1] if k + 1 < len(rest) else None
            flags[w] = True if nxt is None or nxt.startswith("--") or nxt == ">" else nxt
    return flags


def env_of(words: list[str]) -> dict[str, str]:
    i = words.index("env")
    env = {}
    for w in words[i + 1:]:
        if "=" not in w or w.startswith("-"):
            break
        k, v = w.split("=", 1)
        env[k] = v
    return env


# flags the launcher derives (srt-slurm derives or owns them too): present, value its own
DERIVED = {"data-parallel-rpc-port", "data-parallel-hybrid-lb"}
MODES = {"prefill": "prefill", "decode": "decode"}


def same_value(got: object, want: object) -> bool:
    if want is True:
        return got is True
    if isinstance(want, dict):
        return isinstance(got, str) and json.loads(got) == want
    if isinstance(want, str) and want.lstrip().startswith("{"):
        return isinstance(got, str) and json.loads(got) == json.loads(want)
    return str(got) == str(want)


@pytest.mark.parametrize("name", [short(p) for p in SOURCES])
def test_every_flag_and_variable_reaches_its_roles_command_lines(dry_runs, name):
    src, doc, commands = dry_runs[name]
    for mode, role in MODES.items():
        cfg = {k.replace("_", "-"): v for k, v in src["backend"]["vllm_config"][mode].items()}
        env = {**src["backend"].get(f"{mode}_environment", {}), **src.get("environment", {})}
        lines = engine_lines(commands, role)
        assert lines, f"no {role} engine in commands.sh"
        for words in lines:
            flags, got_env = serve_flags(words), env_of(words)
            for flag, want in cfg.items():
                if flag in DERIVED:
                    continue
                if flag == "kv-transfer-config":
                    kv = json.loads(flags["--kv-transfer-config"])
                    assert kv == json.loads(want), (role, kv)
                    continue
                if want is False or want is None:
                    assert f"--{flag}" not in flags, (role, flag)
                    continue
                if flag == "data-parallel-size" and want == 1:
                    assert flags.get("--data-parallel-size", "1") == "1"
                    continue
                assert f"--{flag}" in flags, f"{role}: --{flag} missing"
                assert same_value(flags[f"--{flag}"], want), (role, flag, flags[f"--{flag}"])
            for k, v in env.items():
                if k.startswith("DYN_"):
                    continue  # Dynamo's, a deviation of the import
                assert got_env.get(k) == str(v), (role, k, got_env.get(k), v)


@pytest.mark.parametrize("name", [short(p) for p in SOURCES])
def test_gpus_nodes_and_concurrencies_match_the_source(dry_runs, name):
    src, doc, _ = dry_runs[name]
    res = src["resources"]
    for role in ("prefill", "decode"):
        eps = [e for e in doc["endpoints"] if e["role"] == role]
        assert len(eps) == res[f"{role}_workers"], role
        want = res[f"{role}_workers"] * res[f"gpus_per_{role}"]
        assert sum(e["gpus"] for e in eps) == doc["gpu_count"][role] == want, role
    # srt-slurm's infra node (etcd/NATS for Dynamo) is not asked for: a deviation
    assert len(doc["nodes"]) == res["prefill_nodes"] + res["decode_nodes"]
    want = src["benchmark"].get("concurrencies")
    if src["benchmark"]["type"] == "sa-bench":
        want = [int(x) for x in str(want).split("x")] if isinstance(want, (str, int)) else want
        assert doc["recipe"]["benchmark"]["concurrency"] == want
        assert doc["recipe"]["benchmark"]["input_len"] == src["benchmark"]["isl"]
        assert doc["recipe"]["benchmark"]["output_len"] == src["benchmark"]["osl"]
    else:
        assert src["benchmark"]["type"] == "gsm8k"
        assert doc["recipe"]["accuracy"]["enabled"] and not doc["recipe"]["benchmark"]["enabled"]


@pytest.mark.parametrize("name", [short(p) for p in SOURCES])
def test_the_dry_run_of_each_source_says_where_its_kv_runs_out(dry_runs, name):
    """The user's own file, unchanged: each decode endpoint gets a KV-capacity estimate of
    its model (the checkpoint being elsewhere, from launcher/data/model-facts.yaml), for the
    source's own lengths."""
    src, doc, _ = dry_runs[name]
    decodes = [e["name"] for e in doc["endpoints"] if e["role"] == "decode"]
    caps = {c["name"]: c for c in doc["capacity"]}
    assert sorted(caps) == sorted(decodes), (caps.keys(), decodes)
    isl = src["benchmark"].get("isl")
    for c in caps.values():
        assert c["endpoint_at_mean_length"] > 0 and c["num_gpu_blocks"] > 0
        assert any(v.startswith("launcher/data/model-facts.yaml:") for v in c["sources"].values())
        if isl:
            assert c["lengths"]["input_high"] == isl


def test_the_source_and_its_digest_are_recorded(dry_runs):
    import hashlib

    p = next(s for s in SOURCES if "Kimi" in str(s))
    _, doc, _ = dry_runs[short(p)]
    desc = doc["recipe"]["description"]
    assert hashlib.sha256(p.read_bytes()).hexdigest() in desc
    assert f"{srt_slurm.BUNDLED_FROM}:recipes/multi-node/{short(p)}" in desc


def one_sentence(e: UserError) -> str:
    text = str(e)
    assert PROBLEMS_SEP not in text and "\n" not in text, text
    return text


def load(name: str) -> tuple[Path, dict]:
    p = BUNDLED / "recipes" / "multi-node" / name
    return p, yaml.safe_load(p.read_text())


def test_another_backend_is_refused_in_one_sentence():
    p = next(BUNDLED.rglob("*trtllm*/*.yaml"))
    with pytest.raises(UserError) as e:
        srt_slurm.import_file(p)
    assert "backend.type trtllm" in one_sentence(e.value)


def test_an_alias_is_named_with_the_fix_and_taken_once_given():
    p, _ = load("MiniMax-M2.5/GB200/8k1k/disagg-gb200-3p2d-dep4.yaml")
    with pytest.raises(UserError) as e:
        srt_slurm.import_file(p)
    text = one_sentence(e.value)
    assert "model.path" in text and "--alias minimax-m2.5-fp8=" in text
    data, report = srt_slurm.import_file(p, ALIASES)
    assert data["model"]["path"] == "MiniMaxAI/MiniMax-M2.5"


@pytest.mark.parametrize("where,key", [
    ((), "benchmarks"),                       # a misspelt top-level key
    (("resources",), "gpus_per_decoder"),     # a misspelt key inside a section
    (("benchmark",), "warmup_mult"),
])
def test_a_key_the_import_does_not_know_is_named(where, key):
    p, data = load("Kimi-K2.5/GB200/vllm/8k1k-sa/disagg-gb200-1p4d-dep4-tep4.yaml")
    node = data
    for w in where:
        node = node[w]
    node[key] = 1
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64)
    text = one_sentence(e.value)
    assert ".".join((*where, key)) in text


def test_features_we_do_not_run_are_refused_each_by_name():
    p, data = load("Kimi-K2.5/GB200/vllm/8k1k-sa/disagg-gb200-1p4d-dep4-tep4.yaml")
    data["profiling"] = {"type": "nsys"}
    data["backend"]["connector"] = "lmcache"
    data["benchmark"]["type"] = "mmlu"
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64)
    _, problems = e.value.problems  # a line each where the CLI prints them
    named = " ".join(problems)
    for key in ("profiling", "backend.connector", "benchmark.type"):
        assert key in named, key
    assert len(problems) == 3, problems


def test_recipes_import_writes_a_recipe_that_loads_and_submit_says_it_imported(cli, tmp_path):
    p, _ = load("Kimi-K2.5/GB200/vllm/8k1k-sa/disagg-gb200-1p4d-dep4-tep4.yaml")
    out = tmp_path / "kimi.yaml"
    code, stdout, err = cli("recipes", "import", str(p), "-o", str(out))
    assert code == 0, err
    assert "mapped" in err and "deviation  frontend.type" in err and "0 refused" in err
    text = out.read_text()
    assert text.startswith("# imported ") and "sha256" in text
    code, shown, err = cli("recipes", "show", str(out))
    assert code == 0, err
    assert yaml.safe_load(shown)["decode"]["endpoints"] == 4
    code, stdout, err = cli("submit", str(p), "--dry-run", "--runs-dir", str(tmp_path / "r"))
    assert code == 0, err
    assert "is an srt-slurm recipe, imported on the way" in err


# --- Qwen3.5: the published files are the seed recipe ---------------------------------------

QWEN = sorted(p for p in SOURCES if "Qwen3.5" in str(p))


@pytest.fixture(scope="module")
def seed_runs(tmp_path_factory):
    """{prefill endpoints: (plan.json, commands.sh)} of the seed recipe's five configurations."""
    runs_dir = tmp_path_factory.mktemp("seed")
    out = {}
    for n in (4, 5, 6, 7, 8):
        [run] = prepare.prepare_all("qwen3.5-397b-gb200-disagg", [f"prefill.endpoints={n}"],
                                    [], runs_dir)
        out[n] = (json.loads((run.run.path / "plan.json").read_text()),
                  (run.run.path / "commands.sh").read_text())
    return out


# the launcher's own choices, per node and job: not settings of the recipe
PLACED = {"--port", "--data-parallel-rpc-port", "--data-parallel-address"}


@pytest.mark.parametrize("name", [short(p) for p in QWEN])
def test_each_published_qwen_file_is_the_seed_recipe(dry_runs, seed_runs, name):
    """Imported, each of the 20 Qwen3.5 files runs the engines the seed recipe runs at its
    prefill count, flag for flag and variable for variable: the -ccN files as the seed's
    decode runs from concurrency N (its args_from_concurrency), the -acc files as its GSM8K
    gate."""
    src, doc, commands = dry_runs[name]
    n = src["resources"]["prefill_workers"]
    seed_doc, seed_commands = seed_runs[n]
    cc = src["benchmark"].get("concurrencies")
    for role in ("prefill", "decode"):
        got = engine_lines(commands, role)
        want = engine_lines(seed_commands, role)
        assert len(got) == len(want), role
        for g, w in zip(got, want, strict=True):
            fg = {k: v for k, v in serve_flags(g).items() if k not in PLACED}
            fw = {k: v for k, v in serve_flags(w).items() if k not in PLACED}
            if "-cc" in name and role == "decode":  # the seed's decode from that point on
                restart = next(r for p in seed_doc["processes"] if p["role"] == "decode"
                               for r in p.get("restarts") or []
                               if r["from_concurrency"] == int(cc))
                fw["--max-cudagraph-capture-size"] = serve_flags(restart["argv"])[
                    "--max-cudagraph-capture-size"]
            assert fg == fw, (role, set(fg.items()) ^ set(fw.items()))
            skip = ("PD_", "VLLM_NIXL_SIDE_CHANNEL_")
            eg = {k: v for k, v in env_of(g).items() if not k.startswith(skip)}
            ew = {k: v for k, v in env_of(w).items() if not k.startswith(skip)}
            assert eg == ew, (role, set(eg.items()) ^ set(ew.items()))
    b, sb = doc["recipe"]["benchmark"], seed_doc_recipe(seed_runs, n)["benchmark"]
    if src["benchmark"]["type"] == "sa-bench":
        for k in ("input_len", "output_len", "range_ratio", "length_rule", "chat_template",
                  "prompts_multiplier", "warmup_multiplier"):
            assert b[k] == sb[k], k
        assert set(b["concurrency"]) <= set(sb["concurrency"])
    else:
        a, sa = doc["recipe"]["accuracy"], seed_doc_recipe(seed_runs, n)["accuracy"]
        for k in ("harness", "repeat", "num_shots", "max_tokens"):
            assert a[k] == sa[k], k


def seed_doc_recipe(seed_runs, n: int) -> dict:
    from launcher.schema import recipe

    return recipe.load("qwen3.5-397b-gb200-disagg", [f"prefill.endpoints={n}"]).model_dump(
        mode="json")


def test_the_shipped_srt_slurm_recipes_are_the_import_of_their_sources():
    fresh = srt_slurm.render_shipped()
    assert len(fresh) == 25  # DeepSeek-V4-Pro 8, Kimi-K2.5 8, MiniMax-M2.5 9
    for rel, text in fresh.items():
        f = srt_slurm.SHIPPED / rel
        assert f.exists() and f.read_text() == text, (
            f"{f} is stale: run python -m launcher.schema.srt_slurm and review the diff")
    assert sorted(srt_slurm.SHIPPED.rglob("*.yaml")) == sorted(
        srt_slurm.SHIPPED / r for r in fresh)


def test_several_recipes_make_one_study(tmp_path):
    """A family's files in one submit: a study of one configuration each, in one allocation
    when asked; two files sharing srt-slurm's name are told apart by their folder."""
    names = ["minimax-m2.5-gb200-1k1k-1p1d-tp4", "minimax-m2.5-gb200-1k1k-1p2d-tp4",
             "minimax-m2.5-gb200-1k1k-1p3d-tp4ep"]
    runs = prepare.prepare_all(names, [], [], tmp_path / "runs", allocation="one")
    assert sorted(p.plan.recipe.name for p in runs) == names  # (in the allocation's turns)
    study = json.loads((runs[0].run.path.parent / "study.json").read_text())
    assert study["axes"] == {"recipe": names}
    assert study["recipe"] == "minimax-m2.5-gb200-1k1k"  # their shared name
    assert study["allocation"]["mode"] == "one" and study["allocation"]["nodes"] == 4
    kimi = BUNDLED / "recipes" / "multi-node" / "Kimi-K2.5" / "GB200" / "vllm"
    pair = [str(kimi / d / "disagg-gb200-1p4d-dep4-tp8.yaml") for d in ("1k1k-sa", "8k1k-sa")]
    runs = prepare.prepare_all(pair, [], [], tmp_path / "runs2", allocation="each")
    study = json.loads((runs[0].run.path.parent / "study.json").read_text())
    assert study["axes"] == {"recipe": ["1k1k-sa-kimi-vllm-disagg-gb200-1p4d-dep4-tp8",
                                        "8k1k-sa-kimi-vllm-disagg-gb200-1p4d-dep4-tp8"]}
    with pytest.raises(UserError, match="give each recipe once"):
        prepare.prepare_all([names[0], names[0]], [], [], tmp_path / "runs3")


def test_an_idle_engine_on_ports_or_gpus_another_shape_needs_is_stopped():
    """Configurations of other shapes place other endpoints on an idle engine's GPUs or
    ports: the plan of turns stops it (and the pool does, study.in_the_way), where one on
    GPUs and ports of its own is left loaded."""
    from launcher.planning import study

    def part(name, node, gpus, port, vllm_port):
        return (name, node, tuple(gpus), ("vllm", "serve", "m", "--port", str(port)),
                (("VLLM_PORT", str(vllm_port)),))

    a = {"decode-0": (part("decode-0@n1", "n1", [0, 1], 100, 200),),
         "decode-1": (part("decode-1@n1", "n1", [2, 3], 150, 300),),
         "decode-2": (part("decode-2@n2", "n2", [0, 1], 900, 950),)}
    # one DEP4 decode on n1's four GPUs at decode-1's old port: decode-1 is in the way
    b = {"decode-0": (part("decode-0@n1", "n1", [0, 1, 2, 3], 150, 400),)}
    first, second = study.schedule([("a", a), ("b", b)])
    assert first.run == "a" and second.restart == ("decode-0",)
    assert second.stop == ("decode-1",) and second.idle == ("decode-2",)
    # the same by ports alone: GPUs apart, decode-1's VLLM_PORT range taken
    c = {"decode-0": (part("decode-0@n1", "n1", [0, 1], 100, 200),),
         "prefill-0": (part("prefill-0@n1", "n1", [], 500, 310),)}
    _, third = study.schedule([("a", a), ("c", c)])
    assert third.stop == ("decode-1",) and third.keep == ("decode-0",)
    way = study.in_the_way(a["decode-1"], study.holds(c["prefill-0"]))
    assert {w for _, w in way} == {f"port {p}" for p in range(310, 332)}
