#!/usr/bin/env bash
# Between two jobs of one runner instance (optbot-runner@.service runs it as root before each start
# and after each stop): nothing of the previous job may reach the next one, except the caches meant
# to survive. In order:
#   1. kill every process of the instance's user (the unit's cgroup is already gone; this catches
#      anything that left it), until none is left;
#   2. refuse to go on (exit 1: systemd retries later) while a GPU still holds a process of that user;
#   3. keep the runner's logs (_diag) under --logs, then replace the runner directory by a fresh
#      hard-linked copy of the pristine unpacked release (its files stay root's and read-only: a job
#      cannot patch the runner the next job uses); the job's _work and _temp go with it;
#   4. empty $OPTBOT_HOME except KEEP (compile-cache, weights, downloads), and the instance's tmp.
# Usage: cleanup.sh --instance I [--user NAME|UID] [--runner-dir D] [--pristine D] [--home D] [--tmp D] [--logs D]
set -euo pipefail

KEEP=(compile-cache weights downloads)  # $OPTBOT_HOME entries that survive a job (docs: README.md)
STATE=${OPTBOT_RUNNER_STATE:-/var/lib/optbot-runner}
OPT=${OPTBOT_RUNNER_OPT:-/opt/optbot-runner}
LOGS=${OPTBOT_RUNNER_LOGS:-/var/log/optbot-runner}
instance="" user="" runner_dir="" pristine="" home="" tmp="" logs=""

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
}

die() {
    echo "optbot-runner cleanup: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case $1 in
        --instance) instance=$2; shift 2 ;;
        --user) user=$2; shift 2 ;;
        --runner-dir) runner_dir=$2; shift 2 ;;
        --pristine) pristine=$2; shift 2 ;;
        --home) home=$2; shift 2 ;;
        --tmp) tmp=$2; shift 2 ;;
        --logs) logs=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument $1 (--help)" ;;
    esac
done
[ -n "$instance" ] || die "--instance I is required"
[[ $instance =~ ^[0-9]+$ ]] || die "--instance $instance: expected a number"
user=${user:-optbot-runner-$instance}
runner_dir=${runner_dir:-$STATE/$instance/runner}
pristine=${pristine:-$OPT/actions-runner}
home=${home:-$STATE/$instance/home}
tmp=${tmp:-$STATE/$instance/tmp}
logs=${logs:-$LOGS/$instance}

if [[ $user =~ ^[0-9]+$ ]]; then
    uid=$user gid=$user  # a bare uid (the tests' user namespace has no passwd entry for it)
else
    uid=$(id -u "$user" 2>/dev/null) || die "no user $user"
    gid=$(id -g "$user")
fi
[ "$uid" != 0 ] || die "refusing to clean up for root: a runner's user must be unprivileged"

# The pids of processes whose real or effective uid is the runner's, this script and its
# ancestors excepted (in production those are root's; in the tests, the caller's).
spared=" $$ "
p=$$
while [ "$p" -gt 1 ]; do
    p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
    spared+="$p "
done

strays() {
    local f pid ruid euid state
    for f in /proc/[0-9]*/status; do
        pid=${f#/proc/}; pid=${pid%/status}
        # zombies are already dead (their parent reaps them): not strays
        read -r ruid euid state < <(awk '/^State:/ {s=$2} /^Uid:/ {u=$2" "$3} END {print u, s}' "$f" 2>/dev/null) ||
            continue
        [ "${state:-}" != Z ] || continue
        if [ "$ruid" = "$uid" ] || [ "$euid" = "$uid" ]; then
            # $BASHPID: the subshell of $(strays) itself (of the user only when the tests run it)
            [[ $spared == *" $pid "* ]] || [ "$pid" = "$BASHPID" ] || echo "$pid"
        fi
    done
}

# 1. kill (SIGKILL, repeatedly: a process that forks while we look is caught on the next round)
for _ in $(seq 1 50); do
    left=$(strays)
    [ -z "$left" ] && break
    echo "optbot-runner cleanup: killing stray processes of $user: $(echo "$left" | tr '\n' ' ')"
    for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.1
done
# judged on the loop's last look: a fresh look here could catch a short-lived child of this
# script itself (when the tests run it as the instance's user) and call it a survivor
[ -z "$left" ] || die "processes of $user survive SIGKILL: $(echo "$left" | tr '\n' ' ')"

# 2. the GPUs: a killed process can hold its GPU memory until the driver lets it go
if command -v nvidia-smi >/dev/null; then
    apps=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader) || die "nvidia-smi fails: not starting a GPU runner"
    for pid in $apps; do
        [ -r "/proc/$pid/status" ] || continue
        ruid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
        [ "$ruid" != "$uid" ] || die "GPU process $pid of $user is still alive: not starting (systemd retries)"
    done
else
    echo "optbot-runner cleanup: no nvidia-smi: GPU processes not checked"
fi

# 3. the runner directory: logs kept, then a fresh copy of the pristine release
if [ -d "$runner_dir/_diag" ] && [ ! -L "$runner_dir/_diag" ]; then
    install -d -m 0750 "$logs"
    find "$runner_dir/_diag" -maxdepth 1 -type f -name '*.log' -exec mv -f -t "$logs" {} +
    find "$logs" -maxdepth 1 -type f -mtime +14 -delete
fi
rm -rf --one-file-system "$runner_dir"
if [ -d "$pristine" ]; then
    install -d -m 0755 "$(dirname "$runner_dir")"
    # "/.": the release's contents, also when $pristine is the symlink install.sh points at it
    cp -al "$pristine/." "$runner_dir" 2>/dev/null || { rm -rf "$runner_dir"; cp -a "$pristine/." "$runner_dir"; }
    # only the directories become the user's: config.sh writes .runner, .credentials and _diag/ there
    find "$runner_dir" -type d -exec chown -h "$uid:$gid" {} +
else
    install -d -o "$uid" -g "$gid" -m 0755 "$runner_dir"
fi

# 4. $OPTBOT_HOME: everything but KEEP (a KEEP entry that is not a real directory is removed too:
#    a job could have left a symlink there pointing anywhere) and the instance's tmp
install -d -o "$uid" -g "$gid" -m 0750 "$home"
shopt -s dotglob nullglob
for entry in "$home"/*; do
    name=$(basename "$entry")
    for k in "${KEEP[@]}"; do
        if [ "$name" = "$k" ] && [ -d "$entry" ] && [ ! -L "$entry" ]; then
            continue 2
        fi
    done
    rm -rf --one-file-system "$entry"
done
rm -rf --one-file-system "$tmp"
install -d -o "$uid" -g "$gid" -m 0700 "$tmp"
echo "optbot-runner cleanup: instance $instance clean (kept: ${KEEP[*]} in $home)"
