# .venv-verl: verl 0.9.1 (its v1 trainer) for the tests marked `verl`. Sourced by tests/run.sh (after tests/envs.sh):
# `verl_setup` builds the environment, `verl_tests ARGS` runs those tests there (run.sh passes the -m expression).
# verl pins transformers<5.11, so it cannot share .venv.
# verl's declared dependencies pull no CUDA wheels; its v1 trainer also imports TransferQueue (with pyzmq and msgspec),
# fastapi, uvicorn and cachetools, from verl's `verl-core` extra, named here one by one because the rest of that extra
# (torchcodec, nvtx, qwen_vl_utils, ...) is not needed on CPU. Pins: tests/constraints-verl.txt.

verl_setup() {
    setup_env .venv-verl tests/constraints-verl.txt -e ".[train,test]" "verl==0.9.1" "TransferQueue==0.1.11" \
        fastapi uvicorn cachetools
}

verl_tests() {
    side_pytest verl "$@"
}
