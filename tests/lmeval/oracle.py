"""Runs inside the lm_eval 0.4.13 environment (tests/lmeval/setup.sh), never the project's.

Asks the real package what it does, so tests/test_gsm8k_lmeval.py can hold
launcher/clients/gsm8k.py to it:

    python oracle.py REQUEST.json   ->   JSON on stdout

REQUEST: {"op": "score", "cases": [{"output", "answer"}]}
      or {"op": "prompts", "train": FILE, "test": FILE, "limit": N, "seed": S,
          "num_fewshot": K, "fewshot_split": "train" | "test"}

The task is lm-eval's own gsm8k.yaml, included unchanged, with only the data swapped for
local files (no hub access). Requests are built and filtered by lm-eval's own code paths
(build_all_requests, apply_filters, process_results, the API models' payloads).
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import lm_eval
import lm_eval.tasks
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI
from lm_eval.tasks import TaskManager

logging.disable(logging.WARNING)


def load_task(train: str, test: str, fewshot_split: str = "train"):
    yaml_path = Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml"
    d = Path(tempfile.mkdtemp(prefix="gsm8k-oracle-"))
    atexit.register(shutil.rmtree, d, True)  # read again while the task loads its data
    (d / "gsm8k_local.yaml").write_text(json.dumps({  # JSON is YAML
        "include": str(yaml_path), "task": "gsm8k", "dataset_path": "json",
        "dataset_name": None, "fewshot_split": fewshot_split,
        "dataset_kwargs": {"data_files": {"train": train, "test": test}},
    }))
    tm = TaskManager(include_path=str(d), include_defaults=False)
    return tm.load_task_or_group(["gsm8k"])["gsm8k"]


def score(cases: list[dict]) -> list[dict]:
    here = Path(__file__).resolve().parents[1] / "data" / "gsm8k"
    task = load_task(str(here / "train.jsonl"), str(here / "test.jsonl"))
    instances = []
    for i, c in enumerate(cases):
        doc = {"question": f"case {i}", "answer": c["answer"]}
        inst = Instance(request_type="generate_until", doc=doc, arguments=("", {}), idx=0,
                        metadata=("gsm8k", i, 1))
        inst.resps.append(c["output"])
        instances.append(inst)
    task._instances = instances
    task.apply_filters()  # the YAML's filter_list: regex + take_first, per filter name
    out = []
    for inst in instances:
        row = {}
        for key, filtered in inst.filtered_resps.items():
            row[key] = {"extracted": filtered,
                        "exact_match": task.process_results(inst.doc, [filtered])["exact_match"]}
        out.append(row)
    return out


def prompts(req: dict) -> dict:
    task = load_task(req["train"], req["test"], req.get("fewshot_split", "train"))
    if req.get("num_fewshot") is not None:
        task.set_config(key="num_fewshot", value=req["num_fewshot"])
    comp = LocalCompletionsAPI(base_url="http://127.0.0.1:9/v1/completions", model="m",
                               tokenizer_backend=None)
    chat = LocalChatCompletion(base_url="http://127.0.0.1:9/v1/chat/completions", model="m")
    res: dict = {"plain": [], "multiturn": [], "singleturn": [], "gen_kwargs": None}
    for mode in ("plain", "multiturn", "singleturn"):
        task.set_fewshot_seed(seed=req.get("seed", 1234))  # what simple_evaluate does
        kw = {} if mode == "plain" else {"apply_chat_template": True,
                                          "fewshot_as_multiturn": mode == "multiturn",
                                          "chat_template": chat.apply_chat_template}
        task.build_all_requests(limit=req.get("limit"), **kw)
        lm = comp if mode == "plain" else chat
        for inst in task.instances:
            ctx, gen_kwargs = inst.args[0], inst.args[1]
            res["gen_kwargs"] = gen_kwargs
            body = lm._create_payload(lm.create_message([ctx]), generate=True,
                                      gen_kwargs=copy.deepcopy(gen_kwargs), seed=lm._seed,
                                      eos=lm.eos_string)
            res[mode].append({"doc": inst.doc, "body": body})
    return res


def main() -> None:
    req = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    out = score(req["cases"]) if req["op"] == "score" else prompts(req)
    json.dump({"lm_eval_version": lm_eval.__version__, "result": out}, sys.stdout,
              ensure_ascii=False)


if __name__ == "__main__":
    main()
