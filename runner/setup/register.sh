#!/usr/bin/env bash
# Register runner instance I with GitHub for exactly one job (optbot-runner@.service runs it as root
# before each start, after cleanup.sh), or remove an instance that stopped before it got one.
#   register.sh I            a fresh registration token (optbot runner token: the operator's token
#                            from the root-only $OPTBOT_RUNNER_ETC/github-token), then, as the instance's
#                            user, config.sh --ephemeral --disableupdate --replace with the labels of
#                            the instance's GPUs (optbot runner labels) and $OPTBOT_RUNNER_EXTRA_LABELS
#   register.sh --remove I   config.sh remove with a remove token, unless the runner ran its job
#                            (then GitHub has removed the registration itself)
# The short-lived token reaches config.sh as ACTIONS_RUNNER_INPUT_TOKEN, the runner's own input
# variable, which it reads and clears: never in an argv, which every local user can read.
# Environment (the unit's, from /etc/optbot-runner/runner.env): OPTBOT_RUNNER_URL (required),
# OPTBOT_RUNNER_EXTRA_LABELS, OPTBOT_GITHUB_API_URL, CUDA_VISIBLE_DEVICES (this instance's GPUs).
set -euo pipefail

STATE=${OPTBOT_RUNNER_STATE:-/var/lib/optbot-runner}
OPTBOT=${OPTBOT_RUNNER_OPT:-/opt/optbot-runner}/venv/bin/optbot
TOKEN_FILE=${OPTBOT_RUNNER_ETC:-/etc/optbot-runner}/github-token

die() {
    echo "optbot-runner register: $*" >&2
    exit 1
}

remove=0
case ${1:-} in
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --remove) remove=1; shift ;;
esac
instance=${1:-}
[[ $instance =~ ^[0-9]+$ ]] || die "expected an instance number, got '${instance}' (--help)"
: "${OPTBOT_RUNNER_URL:?is not set: put it in /etc/optbot-runner/runner.env (install.sh --url)}"
user=optbot-runner-$instance
dir=$STATE/$instance/runner
api=()
[ -z "${OPTBOT_GITHUB_API_URL:-}" ] || api=(--github-api-url "$OPTBOT_GITHUB_API_URL")

if [ "$remove" = 1 ]; then
    [ -e "$dir/.runner" ] || exit 0  # never registered, or already cleaned up
    if compgen -G "$dir/_diag/Worker_*.log" >/dev/null; then
        echo "optbot-runner register: instance $instance ran its job; GitHub removed its registration"
        exit 0
    fi
    token=$("$OPTBOT" runner token --remove --url "$OPTBOT_RUNNER_URL" --token-file "$TOKEN_FILE" "${api[@]}")
    cd "$dir"
    ACTIONS_RUNNER_INPUT_TOKEN=$token runuser -u "$user" -- ./config.sh remove
    exit 0
fi

[ -x "$dir/config.sh" ] || die "$dir/config.sh missing: cleanup.sh puts a fresh runner there (install.sh first)"
labels=$("$OPTBOT" runner labels)
[ -z "${OPTBOT_RUNNER_EXTRA_LABELS:-}" ] || labels+=",$OPTBOT_RUNNER_EXTRA_LABELS"
token=$("$OPTBOT" runner token --url "$OPTBOT_RUNNER_URL" --token-file "$TOKEN_FILE" "${api[@]}")
name="$(hostname -s)-$instance"
echo "optbot-runner register: $name at $OPTBOT_RUNNER_URL, labels $labels, one job"
cd "$dir"
ACTIONS_RUNNER_INPUT_TOKEN=$token runuser -u "$user" -- ./config.sh --unattended \
    --url "$OPTBOT_RUNNER_URL" --name "$name" --labels "$labels" --work _work \
    --ephemeral --disableupdate --replace
