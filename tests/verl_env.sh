# .venv-verl: verl 0.9.1 (its v1 trainer) for the tests marked `verl`. Sourced by tests/run.sh after it defines
# setup_env; `verl_tests ARGS` runs those tests there. verl pins transformers<5.11, so it cannot share .venv.
# verl's declared dependencies pull no CUDA wheels; its v1 trainer also imports TransferQueue (with pyzmq and msgspec),
# fastapi, uvicorn and cachetools, from verl's `verl-core` extra, named here one by one because the rest of that extra
# (torchcodec, nvtx, qwen_vl_utils, ...) is not needed on CPU. Pins: tests/constraints-verl.txt.
setup_env .venv-verl tests/constraints-verl.txt -e ".[train,test]" "verl==0.9.1" "TransferQueue==0.1.11" \
    fastapi uvicorn cachetools

verl_tests() {  # the files that hold verl tests only: the others import packages that environment may lack
    local files
    mapfile -t files < <(grep -l "mark.verl" tests/test_*.py)
    local rc=0
    .venv-verl/bin/python -m pytest -m "verl and not slow" "${files[@]}" "$@" || rc=$?
    [ "$rc" -eq 5 ] && rc=0  # none selected (e.g. by -k) is no failure
    return "$rc"
}
