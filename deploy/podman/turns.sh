# Sourced by the scripts in this directory whose pods, containers, volumes or network have fixed names (the
# manifests' own, or a compose project's): two runs on one host would collide, and a run beside another once failed
# CI on "pod already exists". `take_turns NAME "$@"` runs the calling script again under flock on
# /var/tmp/ovq-NAME.lock (-o: the lock stays with flock, not with the containers' monitors the script starts),
# waiting up to 20 minutes, and exits with its status; inside that run it returns at once.
take_turns() {
  local name=$1 lock="/var/tmp/ovq-$1.lock" rc=0
  shift
  [ "${OVQ_PODMAN_TURN:-}" != "$name" ] || return 0
  OVQ_PODMAN_TURN=$name flock -o -w 1200 -E 75 "$lock" "$0" "$@" || rc=$?
  [ "$rc" != 75 ] || echo "$name: another run held $lock for 20 minutes"
  exit "$rc"
}
