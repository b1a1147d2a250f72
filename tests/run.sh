#!/usr/bin/env bash
# The whole test suite from scratch (idempotent; CI runs this): the test environments, a throw-away PostgreSQL and a
# single-node Slurm, lint and type checks, the main run, then each side environment's tests; at the end, how long each
# phase took.
#   .venv               newest TRL and everything else (the package with all extras): the main run
#   .venv-ppo           TRL 1.12.0, the last release with PPOTrainer: the tests marked `ppo` (tests/ppo_env.sh)
#   .venv-verl          verl 0.9.1 (its v1 trainer): `verl` (tests/verl_env.sh)
#   .venv-axolotl       axolotl 0.19.0: `axolotl` (tests/axolotl_env.sh)
#   .venv-llamafactory  llamafactory 0.9.5: `llamafactory` (tests/llamafactory_env.sh)
#   .venv-vllm          vLLM on CPU: `vllm` (tests/vllm_env.sh)
# A side environment is a script tests/NAME_env.sh that, sourced, defines NAME_setup (build .venv-NAME; the helpers of
# tests/envs.sh are there to use) and NAME_tests ARGS (run the tests marked NAME in it, with the pytest arguments given).
# Every such script is used; the main run deselects their markers.
# The order keeps both cores of a CI machine busy: the system packages (apt) install in the background while .venv is
# built and linted; PostgreSQL and Slurm start; the side environments are built in the background (network and disk,
# mostly) during the main run; then the side runs go, as many at a time as there are cores (up to 4).
# Arguments go to every pytest run (`bash tests/run.sh -k detector`); `-m EXPR` replaces the default `not slow` and is
# combined with each run's own markers. PYTEST_WORKERS=N: the main run's xdist workers (0: one process; default the
# cores, up to 4). SIDE_ENVS="ppo verl": only those side environments (SIDE_ENVS= : none). EVALSTOP_INSTALLER=pip: pip
# instead of uv (tests/envs.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# Counted before any thread variable is set: GNU nproc honours OMP_NUM_THREADS (`OMP_NUM_THREADS=1 nproc` prints 1).
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)
# At most 4 by default: tests start servers, Ray instances and trainers of their own, and the slowest single test bounds
# the run anyway. Tests use their own temporary folders, OS-picked loopback ports and PostgreSQL databases, so they run
# side by side.
workers=${PYTEST_WORKERS:-$((cores < 4 ? cores : 4))}
lanes=$((cores < 2 ? 1 : cores < 4 ? cores : 4))
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Python caches compiled bytecode (__pycache__) here even where the machine's environment says not to: the
# installers write none, and the tests start hundreds of processes (servers, trainers, Ray workers, vLLM engines)
# that import torch and transformers, each of which would compile them from source again (a Ray Tune test of a
# tiny GRPO trial: 42 s every time, against 35 s once and 19 s after).
unset PYTHONDONTWRITEBYTECODE
t0=$(date +%s)
work=$(mktemp -d)
. tests/envs.sh
. tests/pg.sh
. tests/slurm.sh

mark="not slow"
args=()
while [ $# -gt 0 ]; do
    case $1 in
        -m) mark=$2; shift 2 ;;
        -m?*) mark=${1#-m}; shift ;;
        *) args+=("$1"); shift ;;
    esac
done

side_all=()  # every side environment (the main run deselects their tests)
for script in tests/*_env.sh; do
    . "$script"
    side_all+=("$(basename "$script" _env.sh)")
done
side_names=()  # those built and run here, the longest runs first so that the last one to start is short
for name in vllm verl axolotl llamafactory ppo "${side_all[@]}"; do
    [[ " ${side_all[*]} " == *" $name "* ]] || continue
    [ -z "${SIDE_ENVS+set}" ] || [[ " $SIDE_ENVS " == *" $name "* ]] || continue
    [[ " ${side_names[*]-} " == *" $name "* ]] || side_names+=("$name")
done

cpu_ticks() {  # "busy total": the machine's CPU time (all cores, in clock ticks) spent busy and in all, since boot
    awk '/^cpu /{ idle = $5 + $6; total = 0; for (i = 2; i <= NF; i++) total += $i; print total - idle, total; exit }' \
        /proc/stat 2>/dev/null || echo "0 0"
}

phase() {  # NAME CMD...: runs CMD; its start, duration, status and how busy the machine's cores were meanwhile go
    # to the table printed at the end (the busy share counts every process: a phase that leaves cores idle shows it)
    local name=$1 start rc=0 busy0 total0 busy1 total1
    shift
    start=$(date +%s)
    read -r busy0 total0 < <(cpu_ticks)
    "$@" || rc=$?
    read -r busy1 total1 < <(cpu_ticks)
    local share=$(((busy1 - busy0) * 100 / (total1 - total0 > 0 ? total1 - total0 : 1)))
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$((start - t0))" "$(($(date +%s) - start))" "$rc" "$share" >>"$work/phases"
    return "$rc"
}

print_phases() {
    [ -s "$work/phases" ] || return 0
    echo "=== tests/run.sh: phases (seconds from the start; $cores cores, main run on $workers xdist workers," \
        "side runs $lanes at a time)"
    printf '%-40s %6s %6s %5s  %s\n' phase start took busy status
    sort -t$'\t' -k2,2n -s "$work/phases" | while IFS=$'\t' read -r name start took rc share; do
        printf '%-40s %6s %6s %4s%%  %s\n' "$name" "$start" "$took" "$share" \
            "$([ "$rc" = 0 ] && echo ok || echo "failed ($rc)")"
    done
    local total=$(($(date +%s) - t0))
    printf '%-40s %6s %6s  (%d min %02d s)\n' total 0 "$total" $((total / 60)) $((total % 60))
}

finish() {
    local rc=$?
    wait || true  # background installs still going (after an early failure): apt and pip are not stopped halfway
    pg_stop
    slurm_stop
    print_phases
    rm -rf "$work"
    exit "$rc"
}
trap finish EXIT

system_packages() {
    # Debian's chromium with its chromedriver (the dashboard's browser test; no browser download), PostgreSQL (tests
    # marked postgres) and Slurm (tests marked slurm), when missing and root: one package-list refresh for all three.
    # tests/pg.sh and tests/slurm.sh would install theirs alone; without them those tests skip saying why.
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
    local browser=() servers=()
    command -v chromedriver >/dev/null 2>&1 || browser=(chromium chromium-driver)
    [ -n "$(_pg_bindir || true)" ] || servers+=(postgresql)
    command -v slurmctld >/dev/null 2>&1 || servers+=(slurmctld slurmd slurm-client)
    [ $((${#browser[@]} + ${#servers[@]})) -gt 0 ] || return 0
    apt-get update -qq || return
    [ "${#browser[@]}" -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${browser[@]}" >/dev/null || return
    [ "${#servers[@]}" -eq 0 ] ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${servers[@]}" >/dev/null
}

lint() {  # a finding fails the run like a failing test
    local rc=0
    .venv/bin/ruff check . || rc=$?
    .venv/bin/ruff format --check . || rc=$?
    .venv/bin/python -m mypy || rc=$?
    return "$rc"
}

build_side_envs() {  # one after another: each install already downloads in parallel, and they share uv's cache
    local name rc
    # Unpacking on one thread: the main run has the cores meanwhile (downloads stay parallel).
    export UV_CONCURRENT_INSTALLS=${UV_CONCURRENT_INSTALLS:-1}
    for name in "${side_names[@]}"; do
        rc=0
        phase "install .venv-$name" "${name}_setup" >"$work/$name.setup.log" 2>&1 || rc=$?
        echo "$rc" >"$work/$name.setup.rc"
    done
}

side_run() {  # NAME: its tests once its environment is built; output in $work/NAME.log, status in $work/NAME.rc
    local name=$1 rc=0
    while [ ! -f "$work/$name.setup.rc" ]; do
        kill -0 "$side_setup_pid" 2>/dev/null || break
        sleep 2
    done
    if [ "$(cat "$work/$name.setup.rc" 2>/dev/null || echo 1)" != 0 ]; then
        { echo "tests/run.sh: building .venv-$name failed:"; cat "$work/$name.setup.log"; } >"$work/$name.log" 2>&1
        rc=1
    else
        phase "$name run" "${name}_tests" -m "$name and ($mark)" "${args[@]}" >"$work/$name.log" 2>&1 || rc=$?
    fi
    echo "$rc" >"$work/$name.rc"
}

side_lane() {  # takes the next side run nobody has claimed (mkdir is atomic), until none is left
    local name
    for name in "${side_names[@]}"; do
        if mkdir "$work/claim.$name" 2>/dev/null; then side_run "$name"; fi
    done
}

phase "system packages (apt)" system_packages >"$work/apt.log" 2>&1 &
apt_pid=$!
phase "installer (uv)" installer_setup
phase "install .venv" setup_env .venv tests/constraints.txt -e ".[all]"
build_side_envs &
side_setup_pid=$!
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
lint_status=0
phase "lint (ruff check, ruff format, mypy)" lint || lint_status=$?
wait "$apt_pid" || { echo "tests/run.sh: installing system packages failed:"; cat "$work/apt.log"; } >&2
services() {
    pg_start
    slurm_start
}
phase "services (PostgreSQL, Slurm)" services

main_mark="($mark)"
for name in "${side_all[@]}"; do main_mark+=" and not $name"; done
status=0
# The 15 slowest tests are listed at its end: where the main run's time goes, in every CI log.
phase "main run ($workers xdist workers)" .venv/bin/python -m pytest -m "$main_mark" -n "$workers" --durations=15 \
    "${args[@]}" || status=$?
[ "$status" -eq 5 ] && status=0  # none selected (e.g. by -k) is no failure

lane_pids=()
for _ in $(seq 1 "$lanes"); do
    side_lane &
    lane_pids+=($!)
done
wait "${lane_pids[@]}" "$side_setup_pid" || true  # the statuses are in the .rc files
for name in "${side_names[@]}"; do
    echo "=== tests/run.sh: the $name environment's tests"
    cat "$work/$name.log"
    side_status=$(cat "$work/$name.rc" 2>/dev/null || echo 1)
    [ "$status" -eq 0 ] && status=$side_status
done
[ "$status" -eq 0 ] && status=$lint_status
exit "$status"
