# .venv-llamafactory: llamafactory 0.9.5 for the tests marked `llamafactory`. Sourced by tests/run.sh after it defines
# setup_env; `llamafactory_tests ARGS` runs those tests there. Not built by setup_env: LLaMA-Factory 0.9.5 imports
# torchaudio at start, and PyPI's torchaudio wheels are CUDA builds that load only next to the CUDA torch of their own
# release, so this environment has torch 2.9.1 + torchaudio 2.9.1 from PyPI (about 7 GB; they run on CPU) instead of
# the CPU torch 2.13.0 of the others. Older LLaMA-Factory releases run without torchaudio but pin transformers 4.x,
# below evalstop's 5.0 (tests/constraints-llamafactory.txt says more). llamafactory goes in with --no-deps: its web UI,
# API server and multimodal readers are not imported by training. Pins: tests/constraints-llamafactory.txt.
[ -x .venv-llamafactory/bin/python ] || "$PY" -m venv .venv-llamafactory
.venv-llamafactory/bin/pip install -q -c tests/constraints-llamafactory.txt torch==2.9.1 torchaudio==2.9.1
.venv-llamafactory/bin/pip install -q --no-deps -c tests/constraints-llamafactory.txt llamafactory==0.9.5
.venv-llamafactory/bin/pip install -q -c tests/constraints-llamafactory.txt -e . pytest \
    transformers trl peft accelerate datasets safetensors omegaconf pyyaml psutil fire "tyro<0.9.0"

llamafactory_tests() {  # the files that hold LLaMA-Factory tests only: the others import packages that env lacks
    local files
    mapfile -t files < <(grep -l "mark.llamafactory" tests/test_*.py)
    local rc=0
    .venv-llamafactory/bin/python -m pytest -m "llamafactory and not slow" "${files[@]}" "$@" || rc=$?
    [ "$rc" -eq 5 ] && rc=0  # none selected (e.g. by -k) is no failure
    return "$rc"
}
