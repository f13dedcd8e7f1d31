#!/usr/bin/env bash
# Take a bare Ubuntu GPU box (NVIDIA driver installed) to N registered, ephemeral, self-hosted
# GitHub Actions runners for optbot (runner/setup/README.md). Idempotent: each step looks first
# and says "have:" when there is nothing to do, so a second run changes nothing.
#
# Usage: sudo runner/setup/install.sh --url https://github.com/OWNER/REPO --optbot-repo URL [options]
#   --url URL           where the runners register (a repository, or https://github.com/ORG)
#   --optbot-repo URL   optbot's git repository; its default branch is checked out (first run only)
#   --instances N       runners on this host (default 1: one job owns every GPU; N>1 splits the GPUs)
#   --token-file PATH   copy the operator's GitHub token from PATH to /etc/optbot-runner/github-token
#   --extra-labels L    labels added to the GPU ones (comma-separated)
#   --extras E          optbot's optional dependencies to install too (e.g. sglang)
#   --torch-index-url U install torch from this index first (e.g. https://download.pytorch.org/whl/cu128)
#   --github-api-url U  GitHub Enterprise's API (e.g. https://ghe.example.com/api/v3)
#   --prefix DIR        put /opt, /etc, /var under DIR (with --dry-run: see the plan for a staging root)
#   --dry-run           print what would be done; change nothing
#   -h, --help          this text
set -euo pipefail

# The GitHub Actions runner, pinned; the tarball is checked against these before it is unpacked.
# (From the release's notes: https://github.com/actions/runner/releases/tag/v2.329.0)
RUNNER_VERSION=2.329.0
RUNNER_SHA256_X64=194f1e1e4bd02f80b7e9633fc546084d8d4e19f3928a324d512ea53430102e1d
RUNNER_SHA256_ARM64=56768348b3d643a6a29d4ad71e9bdae0dc0ef1eb01afe0f7a8ee097b039bfaaf
APT_PACKAGES=(git curl ca-certificates python3-venv python3-dev gcc)  # gcc: Triton builds its launchers

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
url="" optbot_repo="" instances=1 token_file="" extra_labels="" extras="" torch_index="" api_url=""
prefix="" dry_run=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "install.sh: $*" >&2; exit 2; }
have() { echo "have:  $*"; }
# do_ CMD...: run it, or print it under --dry-run
do_() {
    if [ "$dry_run" = 1 ]; then
        echo "would: $*"
    else
        echo "doing: $*"
        "$@"
    fi
}
# put_file PATH MODE OWNER CONTENT: write when missing or different (prints have/would/doing)
put_file() {
    local path=$1 mode=$2 owner=$3 content=$4
    if [ -f "$path" ] && [ "$(cat "$path")" = "$content" ]; then
        have "$path"
        return 1
    fi
    if [ "$dry_run" = 1 ]; then
        echo "would: write $path (mode $mode, $owner)"
    else
        echo "doing: write $path"
        install -d "$(dirname "$path")"
        printf '%s\n' "$content" > "$path.tmp"
        chmod "$mode" "$path.tmp"
        chown "$owner" "$path.tmp"
        mv -f "$path.tmp" "$path"
    fi
}

while [ $# -gt 0 ]; do
    case $1 in
        --url) url=$2; shift 2 ;;
        --optbot-repo) optbot_repo=$2; shift 2 ;;
        --instances) instances=$2; shift 2 ;;
        --token-file) token_file=$2; shift 2 ;;
        --extra-labels) extra_labels=$2; shift 2 ;;
        --extras) extras=$2; shift 2 ;;
        --torch-index-url) torch_index=$2; shift 2 ;;
        --github-api-url) api_url=$2; shift 2 ;;
        --prefix) prefix=${2%/}; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (--help)" ;;
    esac
done

OPT=$prefix/opt/optbot-runner
ETC=$prefix/etc/optbot-runner
STATE=$prefix/var/lib/optbot-runner
LOGS=$prefix/var/log/optbot-runner
UNIT=$prefix/etc/systemd/system/optbot-runner@.service
SYSCTL=$prefix/etc/sysctl.d/60-optbot-runner.conf

[[ $instances =~ ^[1-9][0-9]*$ ]] || die "--instances $instances: expected a positive number"
[[ $url =~ ^https://[^/]+/[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)?$ ]] || \
    die "--url '$url': expected https://github.com/OWNER/REPO or https://github.com/ORG"
[ -n "$optbot_repo" ] || [ -d "$OPT/optbot/.git" ] || die "--optbot-repo URL is needed to check optbot out"
[ -n "$prefix" ] && [ "$dry_run" = 0 ] && die "--prefix is for --dry-run (a staging root); the units expect /"
[ "$dry_run" = 1 ] || [ "$(id -u)" = 0 ] || die "run it as root (sudo), or with --dry-run"
case $(uname -m) in
    x86_64) arch=x64 sha=$RUNNER_SHA256_X64 ;;
    aarch64) arch=arm64 sha=$RUNNER_SHA256_ARM64 ;;
    *) die "unsupported machine $(uname -m): the runner ships for x86_64 and aarch64" ;;
esac

echo "== packages"
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} = 0 ]; then have "${APT_PACKAGES[*]}"; else
    do_ apt-get update
    do_ apt-get install -y --no-install-recommends "${missing[@]}"
fi
command -v nvidia-smi >/dev/null || echo "note:  no nvidia-smi: install the NVIDIA driver (ubuntu-drivers install --gpgpu)"

echo "== kernel: user namespaces for an unprivileged user (the sandbox)"
sysctl_conf=""
[ "$(cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns 2>/dev/null || echo 0)" = 0 ] || \
    sysctl_conf+="kernel.apparmor_restrict_unprivileged_userns=0"$'\n'
[ "$(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 1)" != 0 ] || \
    sysctl_conf+="user.max_user_namespaces=63000"$'\n'
if [ -n "$sysctl_conf" ]; then
    if put_file "$SYSCTL" 0644 root:root "# optbot-runner: its sandbox needs user namespaces (runner/setup/README.md)
${sysctl_conf%$'\n'}"; then do_ sysctl -p "$SYSCTL"; fi
else
    have "user namespaces allowed"
fi

echo "== users: optbot-runner-0..$((instances - 1)), group optbot-runner"
if getent group optbot-runner >/dev/null; then have "group optbot-runner"; else do_ groupadd --system optbot-runner; fi
for i in $(seq 0 $((instances - 1))); do
    if id "optbot-runner-$i" >/dev/null 2>&1; then have "user optbot-runner-$i"; else
        do_ useradd --system --gid optbot-runner --home-dir "$STATE/$i" --no-create-home \
            --shell /usr/sbin/nologin "optbot-runner-$i"
    fi
done

echo "== directories"
for d in "$OPT" "$ETC" "$ETC/drain" "$STATE" "$LOGS"; do
    if [ -d "$d" ]; then have "$d"; else do_ install -d -m 0755 "$d"; fi
done
for i in $(seq 0 $((instances - 1))); do
    if [ -d "$STATE/$i" ]; then have "$STATE/$i"; else
        do_ install -d -o "optbot-runner-$i" -g optbot-runner -m 0750 "$STATE/$i"
    fi
done

echo "== optbot and its Python environment"
if [ -d "$OPT/optbot/.git" ]; then have "$OPT/optbot ($(git -C "$OPT/optbot" rev-parse --short HEAD))"; else
    do_ git clone "$optbot_repo" "$OPT/optbot"  # the default branch
fi
if [ -x "$OPT/venv/bin/python" ]; then have "$OPT/venv"; else do_ python3 -m venv "$OPT/venv"; fi
if [ -x "$OPT/venv/bin/python" ] && [ "$("$OPT/venv/bin/python" -c 'import bot, os; print(os.path.dirname(os.path.dirname(bot.__file__)))' 2>/dev/null)" = "$OPT/optbot" ]; then
    have "optbot installed in $OPT/venv (editable, $OPT/optbot)"
else
    [ -z "$torch_index" ] || do_ "$OPT/venv/bin/pip" install --index-url "$torch_index" torch
    do_ "$OPT/venv/bin/pip" install -e "$OPT/optbot${extras:+[$extras]}"
fi

echo "== the GitHub Actions runner $RUNNER_VERSION ($arch)"
tarball=$OPT/downloads/actions-runner-linux-$arch-$RUNNER_VERSION.tar.gz
release=$OPT/actions-runner-$RUNNER_VERSION
if [ -d "$release" ]; then have "$release"; else
    if [ -f "$tarball" ]; then have "$tarball"; else
        do_ install -d "$OPT/downloads"
        do_ curl -fsSL -o "$tarball" \
            "https://github.com/actions/runner/releases/download/v$RUNNER_VERSION/actions-runner-linux-$arch-$RUNNER_VERSION.tar.gz"
    fi
    if [ "$dry_run" = 1 ]; then echo "would: check sha256 $sha, then unpack into $release"; else
        if ! echo "$sha  $tarball" | sha256sum -c --quiet -; then
            rm -f "$tarball"
            die "the download's sha256 is not the pinned $sha: removed it, nothing unpacked"
        fi
        rm -rf "$release.partial"
        install -d "$release.partial"
        tar -xzf "$tarball" -C "$release.partial"
        "$release.partial/bin/installdependencies.sh"  # the runner's own: .NET's libicu etc., by apt
        mv "$release.partial" "$release"
    fi
fi
if [ "$(readlink "$OPT/actions-runner" 2>/dev/null)" = "$release" ]; then have "$OPT/actions-runner -> $release"; else
    do_ ln -sfn "$release" "$OPT/actions-runner"
fi

echo "== configuration ($ETC)"
put_file "$ETC/runner.env" 0644 root:root "# optbot-runner@.service's environment (install.sh writes it)
OPTBOT_RUNNER_URL=$url
OPTBOT_RUNNER_EXTRA_LABELS=$extra_labels${api_url:+
OPTBOT_GITHUB_API_URL=$api_url}" || true
if [ -n "$token_file" ]; then
    [ -r "$token_file" ] || die "--token-file $token_file: cannot read it"
    put_file "$ETC/github-token" 0600 root:root "$(tr -d '[:space:]' < "$token_file")" || true
elif [ -f "$ETC/github-token" ]; then have "$ETC/github-token"; else
    echo "note:  no $ETC/github-token yet: write the operator's token there (root, mode 0600) or pass --token-file"
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
for i in $(seq 0 $((instances - 1))); do
    if [ "$instances" -gt 1 ]; then
        [ "$gpus" -ge "$instances" ] || die "--instances $instances: only $gpus GPUs to split"
        per=$((gpus / instances))
        put_file "$ETC/instance-$i.env" 0644 root:root "CUDA_VISIBLE_DEVICES=$(seq -s, $((i * per)) $((i * per + per - 1)))" || true
    fi
done

echo "== the unit"
unit=$(sed -e "s|/opt/optbot-runner|$OPT|g" -e "s|/etc/optbot-runner|$ETC|g" \
    -e "s|/var/lib/optbot-runner|$STATE|g" -e "s|/var/log/optbot-runner|$LOGS|g" "$here/optbot-runner@.service")
if put_file "$UNIT" 0644 root:root "$unit"; then do_ systemctl daemon-reload; fi

echo "== check, as optbot-runner-0 (the sandbox as an unprivileged user, the GPUs, disk)"
if [ "$dry_run" = 1 ]; then echo "would: runuser -u optbot-runner-0 -- $OPT/venv/bin/optbot runner check"; else
    OPTBOT_HOME=$STATE/0/home runuser -u optbot-runner-0 -- "$OPT/venv/bin/optbot" runner check --home "$STATE/0" || \
        die "a prerequisite fails (the FAIL lines above): the runners are not enabled"
fi

echo "== enable $instances instance(s)"
if [ ! -f "$ETC/github-token" ] && [ -z "$token_file" ]; then
    echo "note:  not enabling: $ETC/github-token is missing"; exit 0
fi
for i in $(seq 0 $((instances - 1))); do
    if systemctl is-enabled --quiet "optbot-runner@$i" 2>/dev/null; then have "optbot-runner@$i enabled"; else
        do_ systemctl enable --now "optbot-runner@$i"
    fi
done
echo "done: journalctl -u 'optbot-runner@*' -f shows them register and take jobs"
