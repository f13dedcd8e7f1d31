"""`optbot runner check | labels | token`: the self-hosted GPU runner's host side (runner/setup/)."""
from __future__ import annotations

import os
from pathlib import Path

import click

from bot.commands.common import github_option, write_json
from bot.errors import OptbotError

FILE = click.Path(dir_okay=False, path_type=Path)
TOKEN_FILE = Path("/etc/optbot-runner/github-token")


@click.group("runner")
def command():
    """Prepare and register this machine as a self-hosted GPU runner (runner/setup/README.md).

    \b
      optbot runner check                       every prerequisite, one line each; exit 2 if any fails
      optbot runner labels                      the labels this machine's GPUs give: gpu,h200,gpus-8
      optbot runner token --url https://github.com/team/sglang
                                                a one-hour registration token for config.sh
    """


@command.command("check")
@click.option("--home", type=click.Path(path_type=Path), default=None,
              help="Where the disk must have room (default: $OPTBOT_HOME).")
@click.option("--min-free-gib", type=click.FloatRange(min=0), default=None, show_default=False,
              help="Free space needed there, in GiB (default 40).")
@click.option("--no-gpu", is_flag=True, help="Skip the NVIDIA driver and GPU line (checking a CPU machine).")
@click.option("--json", "json_path", type=FILE, default=None, help="Also write the checks as JSON here.")
def check(home, min_free_gib, no_gpu, json_path):
    """Check that this machine can run optbot's GPU jobs: one line per prerequisite, with what to
    do when it fails; exit 2 when any fails.

    \b
    Lines: the sandbox (the very probe a run's first job makes: user, mount, pid, network namespaces),
    kernel.apparmor_restrict_unprivileged_userns (Ubuntu 23.10+), user.max_user_namespaces, the GPUs
    and driver (nvidia-smi), Python, git, free disk under $OPTBOT_HOME.
    Run it as the runner's user (install.sh does): root is exempt from AppArmor's restriction.

    \b
      sudo -u optbot-runner-0 /opt/optbot-runner/venv/bin/optbot runner check
    """
    from bot.jsonable import to_json
    from bot.paths import optbot_home
    from bot.runner_host import MIN_FREE_GIB, check_host

    report = check_host(home or optbot_home(), MIN_FREE_GIB if min_free_gib is None else min_free_gib,
                        need_gpu=not no_gpu)
    for c in report.checks:
        click.echo(c.line())
    if report.gpus:
        click.echo(f"labels: {','.join(report.labels)}")
    if json_path:
        write_json(json_path, {"checks": to_json(report.checks), "labels": report.labels})
    if report.failed:
        raise OptbotError(f"{len(report.failed)} of {len(report.checks)} runner prerequisites fail: "
                          f"{', '.join(c.name for c in report.failed)} (the FAIL lines above say what to do)")


@command.command("labels")
@click.option("--gpus", "indices", default=None, metavar="I,J,...",
              help="Only these GPUs (nvidia-smi indices; default $CUDA_VISIBLE_DEVICES, else all).")
def labels(indices):
    """Print the runner labels of this machine's GPUs, comma-separated: `gpu`, each model's name
    (NVIDIA H200 -> h200, NVIDIA B300 ... -> b300) and `gpus-N`.

    \b
      optbot runner labels               gpu,h200,gpus-8
      optbot runner labels --gpus 0,1    gpu,h200,gpus-2
    """
    from bot.hardware import runner_labels
    from bot.runner_host import query_gpus

    gpus, why_not = query_gpus()
    if not gpus:
        raise OptbotError(f"no GPU to label: {why_not or 'nvidia-smi lists none'}")
    chosen = indices if indices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    if chosen:
        want = [s.strip() for s in chosen.split(",") if s.strip()]
        if not all(s.isdigit() and int(s) < len(gpus) for s in want):
            raise OptbotError(f"--gpus / CUDA_VISIBLE_DEVICES {chosen!r}: expected indices below {len(gpus)}, "
                              f"comma-separated")
        gpus = [gpus[int(s)] for s in dict.fromkeys(want)]
    click.echo(",".join(runner_labels(gpus)))


@command.command("token")
@click.option("--url", required=True, envvar="OPTBOT_RUNNER_URL",
              help="Where the runner registers, as config.sh's --url: https://github.com/OWNER/REPO or "
                   "https://github.com/ORG ($OPTBOT_RUNNER_URL).")
@click.option("--token-file", type=FILE, default=TOKEN_FILE, show_default=True,
              help="The operator's GitHub token, in a file only root may read.")
@click.option("--remove", is_flag=True, help="A remove token (config.sh remove) instead of a registration token.")
@github_option("github-api-url")
def token(url, token_file, remove, github_api_url):
    """Print a one-hour runner registration token for URL on stdout (nothing else there), asked of
    GitHub's API with the operator's token from --token-file; its expiry goes to stderr.

    \b
      token=$(optbot runner token --url https://github.com/team/sglang)
      ACTIONS_RUNNER_INPUT_TOKEN=$token ./config.sh --url https://github.com/team/sglang --ephemeral ...
    The operator's token needs admin rights on the repository (fine-grained: "Administration",
    read and write) or organization (fine-grained: "Self-hosted runners", read and write).
    Exit 2, with one line naming the repository and the missing permission, when GitHub refuses.
    """
    from bot.runner_registration import fetch_token, parse_scope, read_operator_token

    scope = parse_scope(url)
    t = fetch_token(scope, read_operator_token(token_file), github_api_url, "remove" if remove else "registration")
    click.echo(t.token)
    click.echo(f"optbot runner token: {'remove' if remove else 'registration'} token for {scope.kind} {scope.name}, "
               f"expires {t.expires_at}", err=True)
