#!/bin/bash
# Every process of run <RUN_DIR>, in the order the orchestrator starts them.
# The orchestrator also waits for health between stages and tears everything down;
# this file is for reading and for starting one process by hand.
# Secrets are passed by name only: export them before running a line.
# Launcher programs (orchestrator, agents, router, clients) run <PYTHON>
# Run whole, it would start every process, the benchmarks included, at once:
echo "commands.sh is for reading and for copying one line at a time" >&2; exit 2
# Container steps (none): image /var/tmp/pd-vllm-cpu/venv; they see only the image and: <RUN_DIR>, /opt/pd-launcher/launcher (ro)

# preflight-host: the checks before anything starts -> <RUN_DIR>/logs/preflight-host.log
<PYTHON> -m launcher.control.nodecheck --run-dir <RUN_DIR> --where host --node local-1

# preflight-container: the checks before anything starts -> <RUN_DIR>/logs/preflight-container.log
env PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin python3 -m launcher.control.nodecheck --run-dir <RUN_DIR> --where container --engine vllm --node local-1

# agent@local-1 (agent) on local-1 -> <RUN_DIR>/logs/agent@local-1.log
env PD_PROCESS=agent@local-1 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.telemetry.agent --run-dir <RUN_DIR> --node local-1 --interval 1 --exporter-addr 127.0.0.1 --exporter-port 24010 > <RUN_DIR>/logs/agent@local-1.log 2>&1 &

# agg-0@local-1 (engine) on local-1 gpus 0 in the container -> <RUN_DIR>/logs/agg-0@local-1.log
env VLLM_LOGGING_COLOR=0 CUDA_DEVICE_ORDER=PCI_BUS_ID VLLM_PORT=24103 VLLM_LOG_STATS_INTERVAL=2 VLLM_CPU_OMP_THREADS_BIND=0 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PD_PROCESS=agg-0@local-1 PD_RUN_DIR=<RUN_DIR> vllm serve /var/tmp/pd-vllm-cpu/models/tiny-dense --served-model-name tiny-dense --host 127.0.0.1 --port 24100 --tensor-parallel-size 1 --api-server-count 1 --async-scheduling --mamba-ssm-cache-dtype bfloat16 --stream-interval 100 --max-model-len 2048 --kv-cache-memory-bytes 64M --block-size 32 --max-num-seqs 16 --enforce-eager > <RUN_DIR>/logs/agg-0@local-1.log 2>&1 &

# router (router) on local-1 -> <RUN_DIR>/logs/router.log
env PD_PROCESS=router PD_RUN_DIR=<RUN_DIR> <REPO>/.venv/bin/vllm-router --host 127.0.0.1 --port 24000 --worker-urls http://127.0.0.1:24100 --prometheus-host 127.0.0.1 --prometheus-port 24001 > <RUN_DIR>/logs/router.log 2>&1 &

# bench-c1 (bench) on local-1 in the container -> <RUN_DIR>/logs/bench-c1.log
env PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PD_PROCESS=bench-c1 PD_RUN_DIR=<RUN_DIR> vllm bench serve --backend openai --base-url http://127.0.0.1:24000 --endpoint /v1/completions --model tiny-dense --tokenizer /var/tmp/pd-vllm-cpu/models/tiny-dense --dataset-name random --random-input-len 48 --random-output-len 12 --random-range-ratio 0.33 --save-detailed --num-prompts 2 --max-concurrency 1 --num-warmups 1 --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0 --save-result --result-dir <RUN_DIR>/bench --result-filename c00001.json > <RUN_DIR>/logs/bench-c1.log 2>&1 &

# bench-c4 (bench) on local-1 in the container -> <RUN_DIR>/logs/bench-c4.log
env PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PD_PROCESS=bench-c4 PD_RUN_DIR=<RUN_DIR> vllm bench serve --backend openai --base-url http://127.0.0.1:24000 --endpoint /v1/completions --model tiny-dense --tokenizer /var/tmp/pd-vllm-cpu/models/tiny-dense --dataset-name random --random-input-len 48 --random-output-len 12 --random-range-ratio 0.33 --save-detailed --num-prompts 8 --max-concurrency 4 --num-warmups 1 --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0 --save-result --result-dir <RUN_DIR>/bench --result-filename c00004.json > <RUN_DIR>/logs/bench-c4.log 2>&1 &

# accuracy (accuracy) on local-1 in the container -> <RUN_DIR>/logs/accuracy.log
env PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PD_PROCESS=accuracy PD_RUN_DIR=<RUN_DIR> python3 -m launcher.clients.accuracy --base-url http://127.0.0.1:24000 --model tiny-dense --test <RUN_DIR>/inputs/gsm8k_sample_test.jsonl --train <RUN_DIR>/inputs/gsm8k_sample_train.jsonl --num-shots 5 --metric strict-match --max-tokens 32 --concurrency 8 --retries 2 --threshold 0.7 --output <RUN_DIR>/accuracy/gsm8k.json > <RUN_DIR>/logs/accuracy.log 2>&1 &
