#!/usr/bin/env bash
# Sets up the test environments from scratch (idempotent), a throw-away PostgreSQL and a single-node Slurm, and runs
# the whole test suite.
#   .venv      newest TRL and everything else (the package with all extras)
#   .venv-ppo  TRL 1.12.0, the last release with PPOTrainer, for the tests marked `ppo`
#   .venv-verl verl 0.9.1 (its v1 trainer), for the tests marked `verl` (tests/verl_env.sh)
#   .venv-axolotl axolotl 0.19.0, for the tests marked `axolotl` (tests/axolotl_env.sh)
#   .venv-llamafactory llamafactory 0.9.5, for the tests marked `llamafactory` (tests/llamafactory_env.sh)
# Extra arguments go to pytest (e.g. `bash tests/run.sh -k detector`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

setup_env() {  # $1 = venv dir, $2 = constraints file, rest = requirement specs
    local venv=$1 constraints=$2; shift 2
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
    # torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
    "$venv/bin/pip" install -q torch==2.13.0
    "$venv/bin/pip" install -q -c "$constraints" "$@"
}

# The dashboard's browser test drives Debian's chromium through its chromedriver (no browser download); installed
# here when missing and root, otherwise that test skips saying why.
if ! command -v chromedriver >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
        || echo "tests/run.sh: could not install chromium; the dashboard browser test will be skipped" >&2
fi
setup_env .venv tests/constraints.txt -e ".[all]"
setup_env .venv-ppo tests/constraints-ppo.txt -e ".[train,test]" "trl==1.12.0"
. tests/verl_env.sh
. tests/axolotl_env.sh
. tests/llamafactory_env.sh

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Lint, format and type checks first: a finding fails the run like a failing test.
lint_status=0
.venv/bin/ruff check . || lint_status=$?
.venv/bin/ruff format --check . || lint_status=$?
.venv/bin/python -m mypy || lint_status=$?
# A throw-away PostgreSQL server on loopback for the tests marked `postgres` (skipped when none can be had).
. tests/pg.sh
pg_start
# A single-node Slurm cluster (slurmctld + slurmd, as root) for the tests marked `slurm` (skipped when none can be had).
. tests/slurm.sh
slurm_start
trap 'pg_stop; slurm_stop' EXIT
status=0
# Spread over the machine's cores (pytest-xdist; 2 workers on a 2-core machine: about 8 minutes there, instead of
# 10): tests use their own temporary folders, OS-picked loopback ports and PostgreSQL databases, so they run side by side.
# At most 4 by default: tests start servers, Ray instances and trainers of their own, and the slowest single test
# (about 90 s) bounds the run anyway. PYTEST_WORKERS=N sets the count, 0 runs them in this one process.
cores=$(nproc 2>/dev/null || echo 1)
workers=${PYTEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
.venv/bin/python -m pytest -m "not slow and not ppo and not verl and not axolotl and not llamafactory and not vllm" -n "$workers" "$@" || status=$?
# The other environments' tests (TRL 1.12's PPO, verl, Axolotl, LLaMA-Factory): each run is one process, so they go
# two at a time, side by side on a 2-core machine. Each run's output is kept and printed whole once both are done.
# Only the files that hold an environment's tests are collected there (the others import packages it lacks); exit
# code 5 means none were selected (e.g. by -k) and is no failure.
ppo_tests() {
    local files rc=0
    mapfile -t files < <(grep -l "mark.ppo" tests/test_*.py)
    .venv-ppo/bin/python -m pytest -m "ppo and not slow" "${files[@]}" "$@" || rc=$?
    [ "$rc" -eq 5 ] && rc=0
    return "$rc"
}
side_dir=$(mktemp -d)
run_side() {  # $1 = name of the run; the rest: its command. Writes NAME.log and NAME.rc in $side_dir.
    local name=$1 rc=0
    shift
    "$@" >"$side_dir/$name.log" 2>&1 || rc=$?
    echo "$rc" >"$side_dir/$name.rc"
}
(run_side ppo ppo_tests "$@"; run_side verl verl_tests "$@") &
side_a=$!
(run_side axolotl axolotl_tests "$@"; run_side llamafactory llamafactory_tests "$@") &
side_b=$!
wait "$side_a" "$side_b" || true  # the statuses are in the .rc files
for name in ppo verl axolotl llamafactory; do
    echo "=== tests/run.sh: the $name environment's tests"
    cat "$side_dir/$name.log"
    side_status=$(cat "$side_dir/$name.rc" 2>/dev/null || echo 1)
    [ "$status" -eq 0 ] && status=$side_status
done
rm -rf "$side_dir"
[ "$status" -eq 0 ] && status=$lint_status
exit "$status"
