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
<PYTHON> -m launcher.control.nodecheck --run-dir <RUN_DIR> --where host --node local-1 --node local-2

# preflight-container: the checks before anything starts -> <RUN_DIR>/logs/preflight-container.log
env PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin python3 -m launcher.control.nodecheck --run-dir <RUN_DIR> --where container --engine vllm --node local-1 --node local-2

# agent@local-1 (agent) on local-1 -> <RUN_DIR>/logs/agent@local-1.log
env PD_PROCESS=agent@local-1 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.telemetry.agent --run-dir <RUN_DIR> --node local-1 --interval 1 --exporter-addr 127.0.0.1 --exporter-port 24010 > <RUN_DIR>/logs/agent@local-1.log 2>&1 &

# agent@local-2 (agent) on local-2 -> <RUN_DIR>/logs/agent@local-2.log
env PD_PROCESS=agent@local-2 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.telemetry.agent --run-dir <RUN_DIR> --node local-2 --interval 1 --exporter-addr 127.0.0.1 --exporter-port 24011 > <RUN_DIR>/logs/agent@local-2.log 2>&1 &

# decode-0@local-1 (engine) on local-1 gpus 0 in the container -> <RUN_DIR>/logs/decode-0@local-1.log
env VLLM_LOGGING_COLOR=0 CUDA_DEVICE_ORDER=PCI_BUS_ID VLLM_PORT=24103 VLLM_SSM_CONV_STATE_LAYOUT=DS VLLM_LOG_STATS_INTERVAL=2 VLLM_CPU_OMP_THREADS_BIND=1 CUDA_VISIBLE_DEVICES=0 VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=24102 UCX_PROTO_INFO=y PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PD_PROCESS=decode-0@local-1 PD_RUN_DIR=<RUN_DIR> vllm serve /var/tmp/pd-vllm-cpu/models/tiny-hybrid --served-model-name tiny-hybrid --host 127.0.0.1 --port 24100 --tensor-parallel-size 1 --api-server-count 1 --kv-transfer-config '{"kv_buffer_device":"cpu","kv_connector":"NixlConnector","kv_connector_extra_config":{"backends":["UCX"],"kv_lease_duration":120},"kv_role":"kv_consumer"}' --async-scheduling --mamba-ssm-cache-dtype bfloat16 --stream-interval 100 --max-model-len 2048 --kv-cache-memory-bytes 64M --max-num-seqs 16 --enforce-eager > <RUN_DIR>/logs/decode-0@local-1.log 2>&1 &

# prefill-0@local-2 (engine) on local-2 gpus 0 in the container -> <RUN_DIR>/logs/prefill-0@local-2.log
env VLLM_LOGGING_COLOR=0 CUDA_DEVICE_ORDER=PCI_BUS_ID VLLM_PORT=24138 VLLM_SSM_CONV_STATE_LAYOUT=DS VLLM_LOG_STATS_INTERVAL=2 VLLM_CPU_OMP_THREADS_BIND=0 CUDA_VISIBLE_DEVICES=0 VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=24137 PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PD_PROCESS=prefill-0@local-2 PD_RUN_DIR=<RUN_DIR> vllm serve /var/tmp/pd-vllm-cpu/models/tiny-hybrid --served-model-name tiny-hybrid --host 127.0.0.1 --port 24135 --tensor-parallel-size 1 --api-server-count 1 --kv-transfer-config '{"kv_buffer_device":"cpu","kv_connector":"NixlConnector","kv_connector_extra_config":{"backends":["UCX"],"kv_lease_duration":120},"kv_role":"kv_producer"}' --async-scheduling --mamba-ssm-cache-dtype bfloat16 --stream-interval 100 --max-model-len 2048 --kv-cache-memory-bytes 64M --max-num-seqs 16 --enforce-eager > <RUN_DIR>/logs/prefill-0@local-2.log 2>&1 &

# router (router) on local-2 -> <RUN_DIR>/logs/router.log
env PD_PROCESS=router PD_RUN_DIR=<RUN_DIR> <REPO>/.venv/bin/vllm-router --host 127.0.0.1 --port 24000 --vllm-pd-disaggregation --prefill http://127.0.0.1:24135 --decode http://127.0.0.1:24100 --kv-connector nixl --prometheus-host 127.0.0.1 --prometheus-port 24001 > <RUN_DIR>/logs/router.log 2>&1 &

# bench-c1 (bench) on local-2 in the container -> <RUN_DIR>/logs/bench-c1.log
env PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PD_PROCESS=bench-c1 PD_RUN_DIR=<RUN_DIR> python3 -m launcher.clients.bench --backend openai --base-url http://127.0.0.1:24000 --endpoint /v1/completions --model tiny-hybrid --tokenizer /var/tmp/pd-vllm-cpu/models/tiny-hybrid --dataset-name random --random-input-len 32 --random-output-len 8 --random-range-ratio 0.5 --length-rule sa-bench --use-chat-template --sa-bench-warmup --num-prompts 2 --max-concurrency 1 --num-warmups 1 --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0 --save-result --result-dir <RUN_DIR>/bench --result-filename c00001.json > <RUN_DIR>/logs/bench-c1.log 2>&1 &

# bench-c2 (bench) on local-2 in the container -> <RUN_DIR>/logs/bench-c2.log
env PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PD_PROCESS=bench-c2 PD_RUN_DIR=<RUN_DIR> python3 -m launcher.clients.bench --backend openai --base-url http://127.0.0.1:24000 --endpoint /v1/completions --model tiny-hybrid --tokenizer /var/tmp/pd-vllm-cpu/models/tiny-hybrid --dataset-name random --random-input-len 32 --random-output-len 8 --random-range-ratio 0.5 --length-rule sa-bench --use-chat-template --sa-bench-warmup --num-prompts 4 --max-concurrency 2 --num-warmups 1 --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0 --save-result --result-dir <RUN_DIR>/bench --result-filename c00002.json > <RUN_DIR>/logs/bench-c2.log 2>&1 &

# accuracy (accuracy) on local-2 in the container -> <RUN_DIR>/logs/accuracy.log
env PYTHONPATH=<REPO> PATH=/var/tmp/pd-vllm-cpu/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PD_PROCESS=accuracy PD_RUN_DIR=<RUN_DIR> python3 -m launcher.clients.accuracy --base-url http://127.0.0.1:24000 --model tiny-hybrid --test <RUN_DIR>/inputs/gsm8k_sample_test.jsonl --train <RUN_DIR>/inputs/gsm8k_sample_train.jsonl --num-questions 10 --num-shots 5 --metric strict-match --max-tokens 32 --concurrency 8 --retries 2 --threshold 0.7 --output <RUN_DIR>/accuracy/gsm8k.json > <RUN_DIR>/logs/accuracy.log 2>&1 &
