#!/usr/bin/env bash
# Runs the node agent's image under podman with what deploy/daemonset.yaml grants,
# translated flag for flag, so a test on one machine starts it the way a node would:
#
#   DaemonSet                                   podman
#   hostPID: true                               --pid=host
#   runAsUser/runAsGroup 0                      --user 0:0
#   capabilities drop ALL, add BPF, PERFMON     --cap-drop=all --cap-add=BPF,PERFMON
#   seccompProfile RuntimeDefault               --security-opt seccomp=<podman's default
#                                                 with containerd's CAP_BPF gate, see below>
#   allowPrivilegeEscalation: false             --security-opt no-new-privileges
#   readOnlyRootFilesystem: true                --read-only
#   emptyDir /tmp (Memory, 16Mi)                --tmpfs /tmp:size=16m
#   hostPath mounts, readOnly,                  -v HOST:CONTAINER:ro, and the same for
#     recursiveReadOnly: IfPossible               each mount below HOST (podman 4.3 has
#                                                 no "rro"; ro binds only the top one)
#   env NODE_NAME (spec.nodeName)               -e NODE_NAME=$(hostname)
#   limits cpu 200m, memory 64Mi                --cpus=0.2 --memory=64m
#   containerPort 9101                          -p 127.0.0.1:${RT_PORT:-9101}:9101
#
#   deploy/podman-run.sh IMAGE [ARGS...]
#
# ARGS replace the DaemonSet's (node --listen 0.0.0.0:9101 --host-sys /host/sys), e.g. `run -q -- /usr/local/bin/resource-tracker --version`.
# PODMAN_OPTS adds podman run options before the image (default --rm; a test passes
# e.g. "-d --name rt-test"). RT_PORT is the host port on 127.0.0.1 (RT_PORT=none
# publishes nothing).
set -euo pipefail

[[ $# -ge 1 ]] || { echo "usage: $0 IMAGE [ARGS...]" >&2; exit 2; }
image=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
if [[ $# -eq 0 ]]; then
    set -- node --listen 0.0.0.0:9101 --host-sys /host/sys
fi

# Kubernetes' RuntimeDefault on containerd (since containerd#7301, 2022) allows bpf()
# to CAP_BPF; podman's own default (containers-common) still allows it only to
# CAP_SYS_ADMIN, so with it the first BPF map fails with EPERM. The profile that
# stands in for RuntimeDefault is podman's default with that one gate changed.
default_profile=$(podman info --format '{{.Host.Security.SECCOMPProfilePath}}' 2>/dev/null || true)
[[ -r $default_profile ]] || default_profile=/usr/share/containers/seccomp.json
profile=$(mktemp --tmpdir resource-tracker-seccomp.XXXXXX.json)
trap 'rm -f "$profile"' EXIT
jq -f "$here/seccomp-bpf.jq" "$default_profile" >"$profile"

# This VM's podman: crun refuses the cgroup v1 hybrid hierarchy, so runc with
# cgroupfs. Podman's default nofile (1048576) exceeds the hard limit it inherits here
# ("error setting rlimit type 7: operation not permitted"), and conmon runs with
# nproc 32768, so a container may not ask for more (type 6). The agent needs a few
# hundred descriptors per hundred containers and a handful of threads.
podman_global=(--runtime=runc --cgroup-manager=cgroupfs)
nofile=$(ulimit -Hn)
[[ $nofile == unlimited || $nofile -gt 65536 ]] && nofile=65536
ulimits=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=4096:4096")

# A read-only bind of HOST at DST and of every mount below HOST at its place below
# DST, so that the cgroup controllers under /sys/fs/cgroup are read-only too.
ro_tree() {
    local src=$1 dst=$2 m
    printf '%s\n' -v "$src:$dst:ro"
    # mountinfo's 5th field is the mount point; octal escapes (spaces) are skipped.
    while read -r m; do
        printf '%s\n' -v "$m:$dst${m#"$src"}:ro"
    done < <(awk -v p="$src/" 'index($5, p) == 1 && $5 !~ /\\/ { print $5 }' /proc/self/mountinfo | sort -u)
}
mounts=()
while read -r arg; do mounts+=("$arg"); done < <(
    ro_tree /sys/kernel/btf /sys/kernel/btf
    ro_tree /sys/fs/cgroup /sys/fs/cgroup
    ro_tree /sys /host/sys
)

publish=()
port=${RT_PORT:-9101}
[[ $port == none ]] || publish=(-p "127.0.0.1:$port:9101")

# Not exec: the trap removes the profile once podman has read it (at create).
# shellcheck disable=SC2086 # PODMAN_OPTS is a list of options on purpose
podman "${podman_global[@]}" run ${PODMAN_OPTS:---rm} \
    "${ulimits[@]}" \
    --pid=host \
    --user 0:0 \
    --cap-drop=all --cap-add=BPF,PERFMON \
    --security-opt "seccomp=$profile" \
    --security-opt no-new-privileges \
    --read-only --tmpfs /tmp:rw,size=16m,mode=1777 \
    "${mounts[@]}" \
    -e "NODE_NAME=$(hostname)" \
    --cpus=0.2 --memory=64m \
    "${publish[@]}" \
    "$image" "$@"
