"""KV-cache capacity of one vLLM 0.33 engine, shaped like vLLM's own accounting
(docs/kv-capacity.md; per architecture: archs/ and its docs): each architecture turns a model's
facts (facts.py) into one spec per layer cache (specs.py); vLLM's planner groups them
(grouping.py); one estimate (estimate.py) divides the memory left after the weights
(memory.py) by a block's bytes and counts what the sweep's requests hold (result.py).
Pure arithmetic; `read_checkpoint` is the one function that reads files."""

from __future__ import annotations

from launcher.planning.kv.engine import (
                                         Device,
                                         EngineArgs,
                                         Parallelism,
                                         Workload,
                                         prefix_caching,
                                         random_dataset_lengths,
)
from launcher.planning.kv.estimate import estimate, kv_blocks_per_dp_rank, simulator_kv_blocks
from launcher.planning.kv.facts import (
                                         KNOWN_FACTS_SOURCE,
                                         ModelFacts,
                                         kv_dtype_from_quant_config,
                                         read_checkpoint,
)
from launcher.planning.kv.memory import GIB, Overheads
from launcher.planning.kv.result import KvCapacity
from launcher.planning.kv.specs import NoEstimate
from launcher.planning.kv.weights import WeightFacts, weight_bytes_per_gpu
from launcher.run.lengths import Lengths

__all__ = ["GIB", "KNOWN_FACTS_SOURCE", "Device", "EngineArgs", "KvCapacity", "Lengths",
           "ModelFacts", "NoEstimate", "Overheads", "Parallelism", "WeightFacts", "Workload",
           "estimate", "kv_blocks_per_dp_rank", "kv_dtype_from_quant_config", "prefix_caching",
           "random_dataset_lengths", "read_checkpoint", "simulator_kv_blocks",
           "weight_bytes_per_gpu"]
