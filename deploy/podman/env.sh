# Sourced by the scripts in this directory: podman settings this host needs, in a containers.conf of their own
# (CONTAINERS_CONF), so the host's files stay as they are. An operator's own CONTAINERS_CONF wins.
#  - default_ulimits: podman's defaults (nofile 1048576) exceed the hard limits of many CI VMs and containers, and
#    the runtime's setrlimit then fails ("setrlimit RLIMIT_NOFILE: Operation not permitted"): the host's own hard
#    limits, nproc at most kernel.pid_max (runc was refused above it on a VM whose hard nproc was 96365, pid_max
#    32768).
#  - runc where the cgroups are v1 or hybrid and runc is installed: crun refuses hybrid mode ("cgroups in hybrid
#    mode not supported").
if [ -z "${CONTAINERS_CONF:-}" ]; then
  _ovq_conf_dir="${XDG_RUNTIME_DIR:-/tmp}/ovq-podman-$(id -u)"
  mkdir -p -m 700 "$_ovq_conf_dir"
  _ovq_nproc=$(ulimit -Hu)
  _ovq_pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 32768)
  if [ "$_ovq_nproc" = unlimited ] || [ "$_ovq_nproc" -gt "$_ovq_pid_max" ]; then _ovq_nproc=$_ovq_pid_max; fi
  {
    echo "[containers]"
    echo "default_ulimits = [\"nofile=$(ulimit -Hn):$(ulimit -Hn)\", \"nproc=$_ovq_nproc:$_ovq_nproc\"]"
    if [ ! -f /sys/fs/cgroup/cgroup.controllers ] && command -v runc >/dev/null; then
      printf '[engine]\nruntime = "runc"\n'
    fi
  } > "$_ovq_conf_dir/containers.conf"
  export CONTAINERS_CONF="$_ovq_conf_dir/containers.conf"
  unset _ovq_conf_dir _ovq_nproc _ovq_pid_max
fi
