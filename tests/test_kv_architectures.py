"""The KV estimate's shape (issue 49): architectures are named only in their own modules
under launcher/planning/kv/archs/, each module has the same few functions, and the one
that claims a config.json is the one whose facts the estimate then asks for its specs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.planning.kv import archs

KV = Path(__file__).resolve().parents[1] / "launcher" / "planning" / "kv"
INTERFACE = ("NAMES", "CONFIG_FIELDS", "claims", "describes", "read", "unmodelled",
             "count_weights", "caches")


def test_only_the_architecture_modules_name_an_architecture():
    names = {n for a in archs.ARCHITECTURES for n in a.NAMES}
    pattern = re.compile("|".join([r"model_type", r"[\"']architectures[\"']",
                                   *map(re.escape, names)]))
    outside = [f"{p.relative_to(KV)}:{i}" for p in KV.glob("*.py")
               for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert outside == []


@pytest.mark.parametrize("arch", archs.ARCHITECTURES, ids=lambda a: a.__name__.split(".")[-1])
def test_every_architecture_module_has_the_interface(arch):
    assert all(hasattr(arch, name) for name in INTERFACE)
    assert arch.NAMES  # what vLLM calls the models it stands for


@pytest.mark.parametrize("config, arch", [
    ({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64}, "dense"),
    ({"num_hidden_layers": 2, "kv_lora_rank": 512, "qk_rope_head_dim": 64}, "mla"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "gdn_hybrid"),
    ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 128},
     "sliding_window"),
    ({"num_hidden_layers": 2, "compress_ratios": [4, 128], "sliding_window": 128,
      "index_head_dim": 128}, "deepseek_v4"),
])
def test_the_architecture_that_claims_a_config_describes_its_facts(config, arch):
    from launcher.planning import kv

    claimed = archs.for_config(config)
    assert claimed.__name__.endswith(f".{arch}")
    assert archs.for_facts(kv.ModelFacts.from_config(config)) is claimed


def test_a_model_without_attention_layers_is_named_not_estimated():
    from launcher.planning import kv

    facts = kv.ModelFacts.from_config({"num_hidden_layers": 0, "num_key_value_heads": 2})
    with pytest.raises(kv.NoEstimate, match="gives no full-attention layers"):
        kv.estimate(facts, kv.EngineArgs(), kv.Parallelism(), kv.Device(80.0),
                    kv.Workload(10, 1))
