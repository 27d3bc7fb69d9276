"""A tiny tokenizer that ships its own code, made locally (no hub): the shape of Kimi-K2.5's
TikToken tokenizer, which transformers loads only with trust_remote_code and which has no
fast-tokenizer (Rust) backend. Characters are tokens; the chat template is a Jinja file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CODE = '''
import json
import os

from transformers import PreTrainedTokenizer


class TinyCodeTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "vocab.json"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, **kwargs):
        with open(vocab_file) as f:
            self.vocab = json.load(f)
        self.ids = {v: k for k, v in self.vocab.items()}
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return len(self.vocab)

    def get_vocab(self):
        return dict(self.vocab)

    def _tokenize(self, text, **kwargs):
        return list(text)

    def _convert_token_to_id(self, token):
        return self.vocab.get(token, self.vocab["<unk>"])

    def _convert_id_to_token(self, index):
        return self.ids.get(index, "<unk>")

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        path = os.path.join(save_directory, "vocab.json")
        with open(path, "w") as f:
            json.dump(self.vocab, f)
        return (path,)
'''

TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


def write(folder: Path, model_from: Path | None = None) -> Path:
    """The tokenizer in `folder` (with a model's other files copied from `model_from`, so the
    folder is a model too); returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    if model_from is not None:
        for f in model_from.iterdir():
            if f.is_file() and not f.name.startswith(("tokenizer", "chat_template")):
                shutil.copyfile(f, folder / f.name)
    tokens = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(32, 127)]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (folder / "tokenization_tiny.py").write_text(CODE)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "TinyCodeTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_tiny.TinyCodeTokenizer", None]},
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder
