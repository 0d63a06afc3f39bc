#!/usr/bin/env bash
# The GPU benchmark (benchmarks/gpu/gpu_bench.py) as one command on a bare GPU machine that reaches no registry.
#   bash scripts/gpu_check.sh --wheels       # on a machine where pip works: the wheels the GPU image lacks, into .whl/
#   bash scripts/gpu_check.sh [BENCH ARGS]   # on the GPU machine: everything within GPU_CHECK_TOTAL_S (default
#                                            # 480 s): installs and checks, the benchmark (at most what they
#                                            # leave, less 40 s and the profile's GPU_CHECK_PROFILE_S;
#                                            # GPU_CHECK_TIMEOUT_S caps it lower), a profile of one worker step
#                                            # (benchmarks/round/profile_step.py on CUDA), the noise check
# The GPU image has torch, transformers 5.17, accelerate, huggingface_hub and safetensors, but no trl, datasets or
# pydantic: --wheels downloads them (~19 MB, pinned to the versions the benchmark was written against, with
# transformers 5.24 and peft 0.21.2: the versions of the last GPU run) for CPython 3.12 on x86-64; git ignores
# .whl/, so name it in what is carried to the GPU machine. There the script installs them into
# /tmp/site (when .whl/ is there), prints nvidia-smi and the versions, checks the imports, then runs the benchmark
# under `timeout` with its result files written into $OUT when it is set (else benchmarks/gpu/results). The log is
# $OUT/gpu_check.log too. Exit status: the benchmark's (124: the timeout struck; the files keep what it measured).
# A tree copied without git records no commit: set HUBGRPO_BENCH_COMMIT to the commit sent (benchmarks/common.py).
# Before the benchmark it prints whether torch.compile builds a CUDA kernel here (Triton needs a C compiler and
# Python's headers; without them the compiled parts fail in seconds and the eager ones still run); after it, it
# checks the keyed noise on the GPU against its CPU (gpu_replay.py --noise, seconds). The
# benchmark measures both decode modes (worker.decode compiled, then eager) on both shapes and records each round's
# keyed completions; back on a CPU machine, `python benchmarks/gpu/gpu_replay.py --verify gpu_bench.json` replays
# them as a CPU verifier would.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=(trl==1.16.0 transformers==5.24.0 peft==0.21.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)
PY=${PYTHON:-python3}
if [ "${1:-}" = "--wheels" ]; then
  plat=()
  for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do plat+=(--platform "$p"); done
  exec "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d .whl "${WHEELS[@]}"
fi
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: installing .whl/ failed" >&2; exit 3; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
results=${OUT:-benchmarks/gpu/results}
mkdir -p "$results"
log=$results/gpu_check.log
{
  timeout 20 nvidia-smi || echo "gpu_check: no nvidia-smi"
  if command -v cc >/dev/null; then cc --version | head -1; else echo "gpu_check: no C compiler (triton needs one)"; fi
  timeout 45 "$PY" -c "import os, sysconfig, torch
print('Python.h', os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))
f = torch.compile(lambda x: x * 2 + 1)
print('torch.compile on cuda:', f(torch.ones(4, device='cuda')).tolist())" || echo "gpu_check: torch.compile failed"
  timeout 60 "$PY" -c "import torch, trl, peft, transformers, datasets, pydantic, huggingface_hub as h, accelerate as a
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.version.cuda)
print('trl', trl.__version__, 'peft', peft.__version__, 'transformers', transformers.__version__, 'datasets',
      datasets.__version__, 'huggingface_hub', h.__version__, 'accelerate', a.__version__)" \
    || { echo "gpu_check: an import failed: carry the wheels (bash scripts/gpu_check.sh --wheels, here)"; exit 3; }
  # the whole script within GPU_CHECK_TOTAL_S (default 480 s: the issue's 8 minutes): what the installs and checks
  # above used, the step profile's GPU_CHECK_PROFILE_S (default 75 s; 0: none), the noise check's 30 s and a 10-s
  # kill margin come off the benchmark's time
  total=${GPU_CHECK_TOTAL_S:-480}
  left=$(( total - SECONDS - 40 - ${GPU_CHECK_PROFILE_S:-75} ))
  bench=$(( ${GPU_CHECK_TIMEOUT_S:-$left} < left ? ${GPU_CHECK_TIMEOUT_S:-$left} : left ))
  budget=()  # no part of the benchmark starts in its last 70 s (a round is never cut short): unless told otherwise
  [[ " $* " == *" --budget-s "* || " $* " == *" --budget-s="* ]] \
    || budget=(--budget-s $(( bench > 140 ? bench - 70 : bench / 2 )))
  if [ "$bench" -ge 1 ]; then  # (timeout 0 would mean no limit at all)
    echo "gpu_check: the benchmark gets at most ${bench} s ${budget[*]}"
    PYTHONUNBUFFERED=1 timeout -k 10 "$bench" "$PY" benchmarks/gpu/gpu_bench.py --results "$results" "${budget[@]}" "$@"
    status=$?
  else
    echo "gpu_check: no time left for the benchmark (GPU_CHECK_TOTAL_S=$total, ${SECONDS} s used)"; status=124
  fi
  profile=$(( total - SECONDS - 40 ))  # one worker step taken apart, on a random model of SmolLM2's shapes
  if [ "${GPU_CHECK_PROFILE_S:-75}" -gt 0 ] && [ "$profile" -ge 30 ]; then
    set -f  # the arguments are words, never file patterns
    read -ra profile_args <<< "${GPU_CHECK_PROFILE_ARGS:---device cuda --shape smollm2-135m --rounds 2 --set \
params.per_device_train_batch_size=16 --set params.max_completion_length=128}"
    set +f
    PYTHONUNBUFFERED=1 timeout -k 5 "$profile" "$PY" benchmarks/round/profile_step.py --results "$results" \
      --name profile-step-gpu "${profile_args[@]}" || echo "gpu_check: the step profile failed or ran out of time"
  else
    echo "gpu_check: no time left for the step profile"
  fi
  noise=$(( total - SECONDS - 5 < 30 ? total - SECONDS - 5 : 30 ))
  if [ "$noise" -ge 5 ]; then
    PYTHONUNBUFFERED=1 timeout "$noise" "$PY" benchmarks/gpu/gpu_replay.py --noise --results "$results" \
      || echo "gpu_check: the noise check failed"
  else
    echo "gpu_check: no time left for the noise check"
  fi
  exit $status
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
