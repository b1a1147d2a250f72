#!/usr/bin/env bash
# A tiny verl GRPO job with the EvalStop trainer on one GPU (benchmarks/verl_gpu_grpo.py), within about 8 minutes;
# prints one JSON line with the stop step and the best step. Prepared for a GPU machine: no session of this repository
# has run it yet (docs/integrations.md, "verl", says what was and was not run).
#
#   bash benchmarks/verl_gpu_grpo.sh --download   # here, with network: the wheels into $WHEELS (default .whl)
#   bash benchmarks/verl_gpu_grpo.sh [--steps N]  # there, without network: installs from $WHEELS, then runs
#
# The machine needs a CUDA build of torch 2.11 (what verl 0.9.1's vllm extra pins) and one GPU. The wheels are verl
# 0.9.1 with its vLLM rollout (verl[vllm], vLLM 0.24.0) and TransferQueue, with everything they need that the machine
# lacks; where verl and vLLM are installed already (WHEELS pointing at no folder), nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
PY=${PYTHON:-python3}
REQS=("verl[vllm]==0.9.1" "TransferQueue==0.1.11" "fastapi" "uvicorn" "cachetools")

if [ "${1:-}" = "--download" ]; then
    # CPython 3.12 on x86-64 Linux, binary wheels only (the GPU machine builds nothing).
    mkdir -p "$WHEELS"
    "$PY" -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$WHEELS" "${REQS[@]}"
    exit 0
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" "${REQS[@]}"
fi
if ! "$PY" -c "import verl, vllm, torch; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "verl_gpu_grpo: needs verl 0.9.1, vLLM and a CUDA GPU (none found); see the header of $0" >&2
    exit 2
fi
export PYTHONUNBUFFERED=1
timeout "${LIMIT:-480}" "$PY" benchmarks/verl_gpu_grpo.py "$@"
