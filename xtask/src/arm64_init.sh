#!/bin/busybox sh
# /init of the arm64 guest (`cargo xtask arm64`): the release aarch64 binary tracks a
# swarm and an orphan inside a cgroup of their own; one `GUEST` line per result on
# the serial console, read by xtask on the host.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mount -t tmpfs tmp /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "+cpu" > /sys/fs/cgroup/cgroup.subtree_control
echo "GUEST kernel $(uname -r) $(uname -m)"
[ -e /sys/kernel/btf/vmlinux ] && echo "GUEST btf yes" || echo "GUEST btf no"

# The job moves itself into its cgroup first, so the cgroup's CPU is the tree's.
track() {
  name=$1; shift
  mkdir /sys/fs/cgroup/$name
  /resource-tracker run -q --summary /tmp/$name.json -- sh -c "echo \$\$ > /sys/fs/cgroup/$name/cgroup.procs; $*" > /tmp/$name.out 2> /tmp/$name.err
  echo "GUEST $name rc=$? usage_usec=$(sed -n 's/^usage_usec //p' /sys/fs/cgroup/$name/cpu.stat) summary=$(tr -d '\n' < /tmp/$name.json)"
  sed "s/^/GUEST $name stderr: /" /tmp/$name.err
}
# Children are real executables (not busybox applets, which ash may run without a
# fork or an exec), and the loop forks nothing else (`[` and `$((…))` are built in).
# swarm: 100 short children, each a fork and an exec.
track swarm 'i=0; while [ $i -lt 100 ]; do /resource-tracker --version > /dev/null; i=$((i+1)); done'
# orphan: the job exits at once; its subshell, orphaned, runs on for 1 s.
track orphan '(/bin/busybox sleep 1; /resource-tracker --version > /dev/null) & exit 0'
echo "GUEST done"
poweroff -f
