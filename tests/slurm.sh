# A throw-away single-node Slurm cluster for the tests marked `slurm` (and for benchmarks/slurm_queue.py).
#
# Sourced by tests/run.sh:   . tests/slurm.sh; slurm_start; ... slurm_stop
# Or run by hand:            eval "$(bash tests/slurm.sh start)"   ...   bash tests/slurm.sh stop
#
# slurm_start installs Debian's slurmctld, slurmd and slurm-client when `slurmctld` is missing (needs root and
# apt-get), writes a slurm.conf for one node named after this host into a state folder (EVALSTOP_SLURM_DIR, default
# ${TMPDIR:-/tmp}/evalstop-slurm), starts slurmctld and slurmd there, waits until `sinfo` shows the node idle, and
# exports SLURM_CONF (every Slurm command reads the cluster from it) and EVALSTOP_SLURM=1. When the cluster of that
# folder already answers it only exports, so calling it again is fast.
#
# The cluster: one node, CPUs=4 (declared, whatever the machine has: SlurmdParameters=config_overrides) and
# EVALSTOP_SLURM_GPUS "GPU" slots (default 2) as a generic resource `gpu` with no device files, so `sbatch
# --gres=gpu:1` queues jobs behind the slots as on a GPU cluster. Authentication is auth/none with cred/none (this
# Slurm, 22.05, still ships them): no munge daemon to run, and the job's user is still the submitter's Unix user,
# which is all one trusted test node needs. Never use that outside a test machine.
# No slurmdbd: accounting is off, so the job's user and account are read from `squeue -o %u/%a` (the account is the
# free-form --account of the submission). A second Unix user, evalstop-foreign, submits the "foreign" jobs.
# Daemons run as root (slurmd must, to start jobs as other users); without root the tests skip with a reason.
# Nothing here is fatal: when no cluster can be had, the slurm tests skip with a reason and the rest still runs.

_slurm_log() { echo "tests/slurm.sh: $*" >&2; }

_slurm_dir() { echo "${EVALSTOP_SLURM_DIR:-${TMPDIR:-/tmp}/evalstop-slurm}"; }

_slurm_up() {  # the cluster of $1/slurm.conf answers and its node is usable
    SLURM_CONF="$1/slurm.conf" timeout 10 sinfo -h -N -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'
}

slurm_start() {
    local dir
    dir=$(_slurm_dir)
    if [ -f "$dir/slurm.conf" ] && _slurm_up "$dir"; then
        export SLURM_CONF="$dir/slurm.conf" EVALSTOP_SLURM=1 EVALSTOP_SLURM_DIR="$dir"
        _slurm_log "cluster already up (SLURM_CONF=$SLURM_CONF)"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        _slurm_log "not root: cannot run slurmd; tests marked slurm will be skipped"
        return 0
    fi
    if ! command -v slurmctld >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
        _slurm_log "installing slurmctld slurmd slurm-client with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client \
            >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
                     --no-install-recommends slurmctld slurmd slurm-client >/dev/null 2>&1; } \
            || _slurm_log "apt-get install slurm failed"
    fi
    if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1; then
        _slurm_log "no slurmctld/slurmd found; tests marked slurm will be skipped"
        return 0
    fi
    id evalstop-foreign >/dev/null 2>&1 || useradd --system --no-create-home --shell /bin/sh evalstop-foreign
    slurm_stop  # daemons of an earlier, broken start in the same folder
    mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/jobs"
    chmod 1777 "$dir/jobs"  # job scripts and outputs of both users
    local host gpus i
    host=$(hostname -s)
    gpus=${EVALSTOP_SLURM_GPUS:-2}
    cat >"$dir/slurm.conf" <<EOF
# Written by tests/slurm.sh: a single-node test cluster (see the comment at the top of that script).
ClusterName=evalstop-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
SlurmctldPort=${EVALSTOP_SLURM_PORT:-16817}
SlurmdPort=$(( ${EVALSTOP_SLURM_PORT:-16817} + 1 ))
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
# Short intervals: the tests and the queue benchmark time jobs in seconds, not minutes.
SchedulerParameters=bf_interval=1
MessageTimeout=10
KillWait=2
InactiveLimit=0
MinJobAge=300
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 Gres=gpu:$gpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    # gres/gpu counts device files; plain files stand in for them (links to /dev/null: task/none confines nothing, so none is opened).
    mkdir -p "$dir/dev"
    for i in $(seq 0 $(( gpus - 1 ))); do ln -sf /dev/null "$dir/dev/gpu$i"; done
    echo "Name=gpu File=$dir/dev/gpu[0-$(( gpus - 1 ))]" >"$dir/gres.conf"
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -f "$SLURM_CONF" -i >"$dir/log/slurmctld.out" 2>&1 || _slurm_log "slurmctld did not start (see $dir/log)"
    slurmd -f "$SLURM_CONF" >"$dir/log/slurmd.out" 2>&1 || _slurm_log "slurmd did not start (see $dir/log)"
    for i in $(seq 1 60); do
        if _slurm_up "$dir"; then
            export EVALSTOP_SLURM=1 EVALSTOP_SLURM_DIR="$dir"
            _slurm_log "cluster up: node $host, $gpus GPU slots (SLURM_CONF=$SLURM_CONF)"
            return 0
        fi
        # A node that registered as down (e.g. after an unclean stop) is returned to service.
        scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
        sleep 0.5
    done
    _slurm_log "the node did not become idle in 30 s (see $dir/log); tests marked slurm will be skipped"
    unset SLURM_CONF
    return 0
}

slurm_stop() {
    # Only the daemons whose pid files lie in our state folder.
    local dir f pid
    dir=$(_slurm_dir)
    for f in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
            for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        fi
        rm -f "$f"
    done
    unset EVALSTOP_SLURM
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # executed, not sourced
    case "${1:-}" in
        start) slurm_start; [ -n "${EVALSTOP_SLURM:-}" ] && \
                   echo "export SLURM_CONF='$SLURM_CONF' EVALSTOP_SLURM=1 EVALSTOP_SLURM_DIR='$EVALSTOP_SLURM_DIR'" ;;
        stop) slurm_stop ;;
        *) echo "usage: bash tests/slurm.sh start|stop   (start prints export lines for eval)" >&2; exit 2 ;;
    esac
fi
