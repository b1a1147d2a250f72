# .venv-axolotl: axolotl 0.19.0 for the tests marked `axolotl`. Sourced by tests/run.sh after it defines setup_env;
# `axolotl_tests ARGS` runs those tests there. Axolotl pins transformers 5.16.1 and TRL 1.9.0, so it cannot share .venv.
# Axolotl goes in with --no-deps (its declared dependencies pull CUDA-only kernels and cloud clients a CPU run never
# imports); what its training path imports is named here: its pure-Python requirements, plus numba, zstandard,
# bitsandbytes, triton (imported at start even on CPU), evaluate and wandb. Pins: tests/constraints-axolotl.txt.
setup_env .venv-axolotl tests/constraints-axolotl.txt -e . pytest \
    transformers trl peft accelerate datasets tokenizers huggingface_hub hf_xet packaging pydantic PyYAML requests \
    addict fire einops colorama numba numpy scipy typer art tensorboard python-dotenv fastcore sentencepiece \
    immutabledict langdetect schedulefree posthog nvidia-ml-py axolotl-contribs-lgpl axolotl-contribs-mit \
    zstandard bitsandbytes triton evaluate wandb
.venv-axolotl/bin/pip install -q --no-deps -c tests/constraints-axolotl.txt axolotl==0.19.0

axolotl_tests() {  # the files that hold Axolotl tests only: the others import packages that environment lacks
    local files
    mapfile -t files < <(grep -l "mark.axolotl" tests/test_*.py)
    local rc=0
    .venv-axolotl/bin/python -m pytest -m "axolotl and not slow" "${files[@]}" "$@" || rc=$?
    [ "$rc" -eq 5 ] && rc=0  # none selected (e.g. by -k) is no failure
    return "$rc"
}
