# .venv-axolotl: axolotl 0.19.0 for the tests marked `axolotl`. Sourced by tests/run.sh (after tests/envs.sh):
# `axolotl_setup` builds the environment, `axolotl_tests ARGS` runs those tests there (run.sh passes the -m
# expression). Axolotl pins transformers 5.16.1 and TRL 1.9.0, so it cannot share .venv.
# Axolotl goes in with --no-deps (its declared dependencies pull CUDA-only kernels and cloud clients a CPU run never
# imports); what its training path imports is named here: its pure-Python requirements, plus numba, zstandard,
# bitsandbytes, triton (imported at start even on CPU), evaluate and wandb. Pins: tests/constraints-axolotl.txt.

axolotl_setup() {
    setup_env .venv-axolotl tests/constraints-axolotl.txt -e . pytest \
        transformers trl peft accelerate datasets tokenizers huggingface_hub hf_xet packaging pydantic PyYAML requests \
        addict fire einops colorama numba numpy scipy typer art tensorboard python-dotenv fastcore sentencepiece \
        immutabledict langdetect schedulefree posthog nvidia-ml-py axolotl-contribs-lgpl axolotl-contribs-mit \
        zstandard bitsandbytes triton evaluate wandb || return
    env_install .venv-axolotl --no-deps -c tests/constraints-axolotl.txt axolotl==0.19.0
}

axolotl_tests() {
    side_pytest axolotl "$@"
}
