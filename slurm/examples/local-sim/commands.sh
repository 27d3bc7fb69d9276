#!/bin/bash
# Every process of run <RUN_DIR>, in the order the orchestrator starts them.
# The orchestrator also waits for health between stages and tears everything down;
# this file is for reading and for starting one process by hand.
# Secrets are passed by name only: export them before running a line.
# Launcher programs (orchestrator, agents, router, clients) run <PYTHON>
# Run whole, it would start every process, the benchmarks included, at once:
echo "commands.sh is for reading and for copying one line at a time" >&2; exit 2

# preflight-host: the checks before anything starts -> <RUN_DIR>/logs/preflight-host.log
<PYTHON> -m launcher.control.nodecheck --run-dir <RUN_DIR> --where host --node local-1 --node local-2 --node local-3

# preflight-container: the checks before anything starts -> <RUN_DIR>/logs/preflight-container.log
<PYTHON> -m launcher.control.nodecheck --run-dir <RUN_DIR> --where container --engine sim --node local-1 --node local-2 --node local-3

# agent@local-1 (agent) on local-1 -> <RUN_DIR>/logs/agent@local-1.log
env PD_PROCESS=agent@local-1 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.telemetry.agent --run-dir <RUN_DIR> --node local-1 --interval 0.5 --exporter-addr 127.0.0.1 --exporter-port 24010 > <RUN_DIR>/logs/agent@local-1.log 2>&1 &

# agent@local-2 (agent) on local-2 -> <RUN_DIR>/logs/agent@local-2.log
env PD_PROCESS=agent@local-2 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.telemetry.agent --run-dir <RUN_DIR> --node local-2 --interval 0.5 --exporter-addr 127.0.0.1 --exporter-port 24011 > <RUN_DIR>/logs/agent@local-2.log 2>&1 &

# agent@local-3 (agent) on local-3 -> <RUN_DIR>/logs/agent@local-3.log
env PD_PROCESS=agent@local-3 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.telemetry.agent --run-dir <RUN_DIR> --node local-3 --interval 0.5 --exporter-addr 127.0.0.1 --exporter-port 24012 > <RUN_DIR>/logs/agent@local-3.log 2>&1 &

# decode-0@local-1 (engine) on local-1 gpus 0,1 -> <RUN_DIR>/logs/decode-0@local-1.log
env VLLM_LOGGING_COLOR=0 CUDA_DEVICE_ORDER=PCI_BUS_ID VLLM_SSM_CONV_STATE_LAYOUT=DS VLLM_LOG_STATS_INTERVAL=1 CUDA_VISIBLE_DEVICES=0,1 VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=24102 UCX_PROTO_INFO=y SIM_SPEED=2.0 SIM_ANSWER_KEY=<RUN_DIR>/inputs/gsm8k_sample_test.jsonl PD_PROCESS=decode-0@local-1 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.sim serve sim/Qwen3.5-toy --served-model-name qwen3.5-toy --host 127.0.0.1 --port 24100 --tensor-parallel-size 1 --data-parallel-size 4 --data-parallel-size-local 2 --data-parallel-address 127.0.0.1 --data-parallel-rpc-port 24101 --enable-expert-parallel --api-server-count 1 --kv-transfer-config '{"kv_buffer_device":"cuda","kv_connector":"NixlConnector","kv_connector_extra_config":{"backends":["UCX"]},"kv_role":"kv_consumer"}' --async-scheduling --stream-interval 10 --block-size 16 --max-num-seqs 128 --num-gpu-blocks-override 384 > <RUN_DIR>/logs/decode-0@local-1.log 2>&1 &

# decode-0@local-2 (engine) on local-2 gpus 0,1 -> <RUN_DIR>/logs/decode-0@local-2.log
env VLLM_LOGGING_COLOR=0 CUDA_DEVICE_ORDER=PCI_BUS_ID VLLM_SSM_CONV_STATE_LAYOUT=DS VLLM_LOG_STATS_INTERVAL=1 CUDA_VISIBLE_DEVICES=0,1 VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=24102 UCX_PROTO_INFO=y SIM_SPEED=2.0 SIM_ANSWER_KEY=<RUN_DIR>/inputs/gsm8k_sample_test.jsonl PD_PROCESS=decode-0@local-2 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.sim serve sim/Qwen3.5-toy --served-model-name qwen3.5-toy --tensor-parallel-size 1 --data-parallel-size 4 --data-parallel-size-local 2 --data-parallel-address 127.0.0.1 --data-parallel-rpc-port 24101 --enable-expert-parallel --headless --data-parallel-start-rank 2 --kv-transfer-config '{"kv_buffer_device":"cuda","kv_connector":"NixlConnector","kv_connector_extra_config":{"backends":["UCX"]},"kv_role":"kv_consumer"}' --async-scheduling --stream-interval 10 --block-size 16 --max-num-seqs 128 --num-gpu-blocks-override 384 > <RUN_DIR>/logs/decode-0@local-2.log 2>&1 &

# prefill-0@local-3 (engine) on local-3 gpus 0,1 -> <RUN_DIR>/logs/prefill-0@local-3.log
env VLLM_LOGGING_COLOR=0 CUDA_DEVICE_ORDER=PCI_BUS_ID VLLM_PORT=24174 VLLM_SSM_CONV_STATE_LAYOUT=DS VLLM_LOG_STATS_INTERVAL=1 CUDA_VISIBLE_DEVICES=0,1 VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=24172 SIM_SPEED=2.0 SIM_ANSWER_KEY=<RUN_DIR>/inputs/gsm8k_sample_test.jsonl PD_PROCESS=prefill-0@local-3 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.sim serve sim/Qwen3.5-toy --served-model-name qwen3.5-toy --host 127.0.0.1 --port 24170 --tensor-parallel-size 1 --data-parallel-size 2 --data-parallel-size-local 2 --enable-expert-parallel --api-server-count 1 --kv-transfer-config '{"kv_buffer_device":"cuda","kv_connector":"NixlConnector","kv_connector_extra_config":{"backends":["UCX"]},"kv_role":"kv_producer"}' --async-scheduling --stream-interval 10 --block-size 16 --max-num-seqs 128 --max-num-batched-tokens 2048 --num-gpu-blocks-override 2048 > <RUN_DIR>/logs/prefill-0@local-3.log 2>&1 &

# prefill-1@local-3 (engine) on local-3 gpus 2,3 -> <RUN_DIR>/logs/prefill-1@local-3.log
env VLLM_LOGGING_COLOR=0 CUDA_DEVICE_ORDER=PCI_BUS_ID VLLM_PORT=24210 VLLM_SSM_CONV_STATE_LAYOUT=DS VLLM_LOG_STATS_INTERVAL=1 CUDA_VISIBLE_DEVICES=2,3 VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT=24208 SIM_SPEED=2.0 SIM_ANSWER_KEY=<RUN_DIR>/inputs/gsm8k_sample_test.jsonl PD_PROCESS=prefill-1@local-3 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.sim serve sim/Qwen3.5-toy --served-model-name qwen3.5-toy --host 127.0.0.1 --port 24206 --tensor-parallel-size 1 --data-parallel-size 2 --data-parallel-size-local 2 --enable-expert-parallel --api-server-count 1 --kv-transfer-config '{"kv_buffer_device":"cuda","kv_connector":"NixlConnector","kv_connector_extra_config":{"backends":["UCX"]},"kv_role":"kv_producer"}' --async-scheduling --stream-interval 10 --block-size 16 --max-num-seqs 128 --max-num-batched-tokens 2048 --num-gpu-blocks-override 2048 > <RUN_DIR>/logs/prefill-1@local-3.log 2>&1 &

# router (router) on local-3 -> <RUN_DIR>/logs/router.log
env PD_PROCESS=router PD_RUN_DIR=<RUN_DIR> <REPO>/.venv/bin/vllm-router --host 127.0.0.1 --port 24000 --vllm-pd-disaggregation --prefill http://127.0.0.1:24170 --prefill http://127.0.0.1:24206 --decode http://127.0.0.1:24100 --kv-connector nixl --prometheus-host 127.0.0.1 --prometheus-port 24001 > <RUN_DIR>/logs/router.log 2>&1 &

# bench-c4 (bench) on local-3 -> <RUN_DIR>/logs/bench-c4.log
env PD_PROCESS=bench-c4 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.clients.bench --backend openai --base-url http://127.0.0.1:24000 --endpoint /v1/completions --model qwen3.5-toy --tokenizer sim/Qwen3.5-toy --dataset-name random --random-input-len 512 --random-output-len 64 --random-range-ratio 0.5 --length-rule sa-bench --sa-bench-warmup --num-prompts 24 --max-concurrency 4 --num-warmups 4 --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0 --save-result --result-dir <RUN_DIR>/bench --result-filename c00004.json > <RUN_DIR>/logs/bench-c4.log 2>&1 &

# bench-c16 (bench) on local-3 -> <RUN_DIR>/logs/bench-c16.log
env PD_PROCESS=bench-c16 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.clients.bench --backend openai --base-url http://127.0.0.1:24000 --endpoint /v1/completions --model qwen3.5-toy --tokenizer sim/Qwen3.5-toy --dataset-name random --random-input-len 512 --random-output-len 64 --random-range-ratio 0.5 --length-rule sa-bench --sa-bench-warmup --num-prompts 96 --max-concurrency 16 --num-warmups 4 --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0 --save-result --result-dir <RUN_DIR>/bench --result-filename c00016.json > <RUN_DIR>/logs/bench-c16.log 2>&1 &

# bench-c64 (bench) on local-3 -> <RUN_DIR>/logs/bench-c64.log
env PD_PROCESS=bench-c64 PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.clients.bench --backend openai --base-url http://127.0.0.1:24000 --endpoint /v1/completions --model qwen3.5-toy --tokenizer sim/Qwen3.5-toy --dataset-name random --random-input-len 512 --random-output-len 64 --random-range-ratio 0.5 --length-rule sa-bench --sa-bench-warmup --num-prompts 384 --max-concurrency 64 --num-warmups 4 --ignore-eos --temperature 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0 --save-result --result-dir <RUN_DIR>/bench --result-filename c00064.json > <RUN_DIR>/logs/bench-c64.log 2>&1 &

# accuracy (accuracy) on local-3 -> <RUN_DIR>/logs/accuracy.log
env PD_PROCESS=accuracy PD_RUN_DIR=<RUN_DIR> <PYTHON> -m launcher.clients.accuracy --base-url http://127.0.0.1:24000 --model qwen3.5-toy --test <RUN_DIR>/inputs/gsm8k_sample_test.jsonl --train <RUN_DIR>/inputs/gsm8k_sample_train.jsonl --num-shots 5 --metric strict-match --max-tokens 256 --concurrency 16 --retries 2 --threshold 0.7 --output <RUN_DIR>/accuracy/gsm8k.json > <RUN_DIR>/logs/accuracy.log 2>&1 &
