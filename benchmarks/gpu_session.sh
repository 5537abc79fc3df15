#!/usr/bin/env bash
# Ground truth on one CUDA GPU in one go (issue 21): the CUDA tests, the two issue models validated (fp32
# and bf16) and traced, their traces replayed with --gpu what-ifs, the single-GPU validation scenario with
# peak memory, then the whole test suite with what time is left.
#
#   benchmarks/gpu_session.sh OUT [SECONDS] [STEPS]
#
# OUT gets one log per step (STEP.log), summary.txt (each step's exit status and time) and the figures,
# bundles, reports and traces. SECONDS (default 560) bounds the whole session: each step has its own limit
# and the last ones get what is left. STEPS (default: all) is a comma list of env,cuda-tests,loader-copy,
# peak-memory,resnet50,gpt2-small,layer-timing,profiler-cost,replay,accuracy,suite. ACCURACY_REPEATS (2: validate-gpu, each with its
# own calibration) and MODEL_ROUNDS (2: real runs per variant of the two models) size the validations.
# Assumes trainsim is installed (README).
set -u
out=${1:?usage: gpu_session.sh OUT [SECONDS] [STEPS]}
budget=${2:-560}
steps=${3:-env,cuda-tests,loader-copy,peak-memory,resnet50,gpt2-small,layer-timing,profiler-cost,replay,accuracy,suite}
mkdir -p "$out"
summary="$out/summary.txt"
began=$(date +%s)
export PYTHONUNBUFFERED=1

wanted() { [[ ",$steps," == *",$1,"* ]]; }

# step NAME LIMIT_S COMMAND...: run, log to OUT/NAME.log, note status and time in the summary
step() {
    local name=$1 limit=$2
    shift 2
    wanted "$name" || return 0
    local left=$((budget - ($(date +%s) - began)))
    ((limit > left)) && limit=$left
    if ((limit < 10)); then
        echo "$name: not run (no time left)" | tee -a "$summary"
        return 0
    fi
    local t0=$(date +%s)
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc in $(($(date +%s) - t0)) s (limit $limit s)" | tee -a "$summary"
    tail -n 25 "$out/$name.log"
}

py=${PYTHON:-python3}
accuracy_repeats=${ACCURACY_REPEATS:-2}  # validate-gpu, each repeat with its own calibration
model_rounds=${MODEL_ROUNDS:-2}  # the two models' variants, each run this many times round-robin
single=single,single-pinned,preload,single-bf16,offload-save-on-cpu,offload-prefetch-1,offload-prefetch-3
single=$single,single-adam,offload-optimizer,single-alexnet

step env 30 bash -c "nvidia-smi; $py -c 'import torch, sys; print(sys.version); print(torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)'"
step cuda-tests 150 $py -m pytest -q -p no:cacheprovider -rs tests/test_offload.py tests/test_linkbench.py \
    tests/test_layer_profile.py tests/test_calibrate_cli.py tests/test_exec_config.py tests/test_datapipe.py \
    tests/test_profiler_cost.py
step loader-copy 60 $py benchmarks/loader_batch_copy.py --device cuda
step peak-memory 60 $py benchmarks/peak_memory.py --device cuda
for model in resnet50 gpt2-small; do
    step "$model" 150 $py benchmarks/validate_accuracy.py --scenario "benchmarks/gpu/$model.yaml" \
        --repeats 1 --rounds "$model_rounds" --out "$out/$model" --results "$out/$model.txt"
done
# per-layer times of GPT-2 in bf16 both ways: between CUDA events at the hooks (a host-bound hooked step
# counts its launch gaps as layer time) and as the kernels launched inside them; the plain step beside both
layer_timing() {
    local timing
    for timing in clock kernels; do
        echo "## calibrate layers gpt2-small bf16 --layer-timing $timing"
        $py -m trainsim.cli calibrate layers gpt2-small --device cuda --batch-sizes 8 --set block_size=512 \
            --optimizer adam --precision bf16 --repeats 5 --warmup 2 --layer-timing "$timing" \
            --out "$out/layers-gpt2-small-bf16-$timing.json" --json \
            | $py -c "import json, sys; d = json.load(sys.stdin); print({k: d[k] for k in \
                ('iteration_s', 'unattributed_s', 'host_dispatch_s')}, 'layers:', \
                sum(sum(r[p].values()) for r in d['per_layer'] for p in ('forward_s', 'backward_s')))"
    done
}
wanted layer-timing && step layer-timing 120 bash -c "$(declare -f layer_timing); out='$out'; py='$py'; \
    layer_timing"
# what the profiler costs this host per recorded event, at each model's batch and precision: the figure the
# untraced replays below take out of the traces
profiler_cost() {
    local precision
    for precision in fp32 bf16; do
        $py -m trainsim.cli calibrate profiler resnet50 --device cuda --batch-size 64 --precision "$precision" \
            --json >"$out/profiler-resnet50-$precision.json" && cat "$out/profiler-resnet50-$precision.json"
        $py -m trainsim.cli calibrate profiler gpt2-small --device cuda --batch-size 8 --set block_size=512 \
            --optimizer adam --precision "$precision" --json >"$out/profiler-gpt2-small-$precision.json" \
            && cat "$out/profiler-gpt2-small-$precision.json"
    done
}
wanted profiler-cost && step profiler-cost 120 bash -c "$(declare -f profiler_cost); out='$out'; py='$py'; \
    profiler_cost"
replay() {
    local trace model precision cost
    for trace in "$out"/resnet50/report-0/traces/*.torch.rank0.json "$out"/gpt2-small/report-0/traces/*.torch.rank0.json; do
        [[ -e $trace ]] || continue
        echo "## $trace"
        $py -m trainsim.cli replay "$trace"
        model=$(basename "$(dirname "$(dirname "$(dirname "$trace")")")")
        precision=fp32
        [[ $trace == *-bf16.* ]] && precision=bf16
        cost=$($py -c "import json, sys; print(max(json.load(open(sys.argv[1]))['per_event_s'], 0) * 1e6)" \
            "$out/profiler-$model-$precision.json" 2>/dev/null || echo 0)
        echo "## $trace --set untraced=true --set profiler_event_us=$cost"
        $py -m trainsim.cli replay "$trace" --set untraced=true --set "profiler_event_us=$cost"
        for gpu in h100-sxm a100-80gb v100-32gb; do
            echo "## $trace --gpu $gpu"
            $py -m trainsim.cli replay "$trace" --gpu "$gpu"
        done
    done
}
wanted replay && step replay 90 bash -c "$(declare -f replay); out='$out'; py='$py'; replay"
# last, as it is the longest: what it prints is kept line by line, so a cut-off run keeps its first repeats
step accuracy 400 $py benchmarks/validate_accuracy.py --scenario validate-gpu --repeats "$accuracy_repeats" \
    --rounds 1 --variants "$single" --out "$out/accuracy" --results "$out/accuracy.txt"
# the whole suite, on 8 workers where pytest-xdist is installed
parallel=$($py -c 'import xdist' 2>/dev/null && echo "-n 8")
step suite 600 $py -m pytest -q -p no:cacheprovider -rs $parallel
echo "session: $(($(date +%s) - began)) s" | tee -a "$summary"
