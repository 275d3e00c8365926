# Turns a containers-common/moby style seccomp profile (podman's default) into what
# containerd and Docker give as RuntimeDefault since 2022 (containerd#7301,
# moby#43987): bpf() allowed to CAP_BPF and perf_event_open() to CAP_PERFMON, not
# only to CAP_SYS_ADMIN. Everything else in the profile is kept as it is.
# Exactly one rule names each of the two syscalls for any set of capabilities, so
# the runtime never meets two actions for one syscall.
def gated($sc; $cap):
  [ {names: [$sc], action: "SCMP_ACT_ALLOW", includes: {caps: [$cap]}, excludes: {}},
    {names: [$sc], action: "SCMP_ACT_ALLOW", includes: {caps: ["CAP_SYS_ADMIN"]}, excludes: {caps: [$cap]}},
    {names: [$sc], action: "SCMP_ACT_ERRNO", errnoRet: 1, includes: {},
     excludes: {caps: ["CAP_SYS_ADMIN", $cap]}} ];

.syscalls |= (map(.names -= ["bpf", "perf_event_open"] | select(.names | length > 0))
              + gated("bpf"; "CAP_BPF") + gated("perf_event_open"; "CAP_PERFMON"))
