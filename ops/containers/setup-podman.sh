#!/usr/bin/env bash
# Make a Docker-compatible engine answer at $AGENTRL_PODMAN_SOCKET (default
# /run/agentrl-podman.sock): podman's API service, for the docker SDK.
#
# Idempotent and fast when already done: packages are installed only when missing,
# the config is written only when it differs, and a service that already answers on
# the socket is reused. Prints `export DOCKER_HOST=unix://...` on stdout (everything
# else goes to stderr), so `eval "$(ops/containers/setup-podman.sh)"` works.
# Runs as root (installs packages, writes /etc/containers).
set -euo pipefail

SOCKET="${AGENTRL_PODMAN_SOCKET:-/run/agentrl-podman.sock}"
LOG="${AGENTRL_PODMAN_LOG:-/var/log/agentrl-podman.log}"
CONF=/etc/containers/containers.conf

say() { echo "setup-podman: $*" >&2; }

# 1. Packages, only those missing (podman's runtime is runc: crun is not in bookworm's
#    default set; debootstrap builds the base image; bubblewrap is for sandboxes).
missing=()
for pkg in podman runc debootstrap bubblewrap; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt_get() { apt-get -o DPkg::Lock::Timeout=600 -qq "$@" >&2; }
    apt_get install -y --no-install-recommends "${missing[@]}" uidmap slirp4netns \
        || { apt_get update && apt_get install -y --no-install-recommends "${missing[@]}" uidmap slirp4netns; }
fi

# 2. containers.conf. This machine has no systemd (and cgroup v1): cgroups through
#    cgroupfs, events to a file, no journald log driver. Workers run with the host's
#    network, so no network backend is needed for them.
want=$(cat <<'CONFEOF'
# Written by agentrl ops/containers/setup-podman.sh
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONFEOF
)
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$want" ]; then
    mkdir -p "$(dirname "$CONF")"
    [ -f "$CONF" ] && ! grep -q "Written by agentrl" "$CONF" && cp "$CONF" "$CONF.before-agentrl"
    printf '%s\n' "$want" >"$CONF"
    say "wrote $CONF"
fi

# 2b. Ids for containers' user namespaces (the os sandbox asks podman for `auto`: root in
#     a container is an unprivileged id on the host): a range for podman's `containers`
#     user, away from the bwrap sandbox's (uid 1000000000 and up).
for ids in /etc/subuid /etc/subgid; do
    if ! grep -q '^containers:' "$ids" 2>/dev/null; then
        echo "containers:2000000000:100000000" >>"$ids"
        say "added a containers range to $ids"
    fi
done

# 3. The API service: reuse one that answers, else start it in the background.
answers() { curl -fsS --max-time 3 --unix-socket "$SOCKET" http://d/_ping >/dev/null 2>&1; }
if ! answers; then
    rm -f "$SOCKET"  # a stale socket file from a service that died
    say "starting podman system service on unix://$SOCKET (log: $LOG)"
    # From /run, not the caller's directory: conmon drops files (an `oom` marker when a
    # container is OOM-killed) into the service's working directory.
    (cd "$(dirname "$SOCKET")" && exec nohup setsid podman system service --time=0 "unix://$SOCKET") \
        >>"$LOG" 2>&1 </dev/null &
    for _ in $(seq 100); do answers && break; sleep 0.2; done
    answers || { say "podman did not answer on $SOCKET; see $LOG"; tail -20 "$LOG" >&2; exit 1; }
fi
echo "export DOCKER_HOST=unix://$SOCKET"
