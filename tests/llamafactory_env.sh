# .venv-llamafactory: llamafactory 0.9.5 for the tests marked `llamafactory`. Sourced by tests/run.sh (after
# tests/envs.sh): `llamafactory_setup` builds the environment, `llamafactory_tests ARGS` runs those tests there (run.sh
# passes the -m expression). Not built by setup_env: LLaMA-Factory 0.9.5 imports torchaudio at start, and PyPI's
# torchaudio wheels are CUDA builds that load only next to the CUDA torch of their own release, so this environment
# has torch 2.9.1 + torchaudio 2.9.1 from PyPI (about 7 GB; they run on CPU) instead of the CPU torch 2.13.0 of the
# others. Older LLaMA-Factory releases run without torchaudio but pin transformers 4.x, below evalstop's 5.0
# (tests/constraints-llamafactory.txt says more). llamafactory goes in with --no-deps: its web UI, API server and
# multimodal readers are not imported by training. Pins: tests/constraints-llamafactory.txt.

llamafactory_setup() {
    local venv=.venv-llamafactory constraints=tests/constraints-llamafactory.txt
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv" || return
    env_install "$venv" -c "$constraints" torch==2.9.1 torchaudio==2.9.1 || return
    env_install "$venv" --no-deps -c "$constraints" llamafactory==0.9.5 || return
    env_install "$venv" -c "$constraints" -e . pytest \
        transformers trl peft accelerate datasets safetensors omegaconf pyyaml psutil fire "tyro<0.9.0"
}

llamafactory_tests() {
    side_pytest llamafactory "$@"
}
