# Sourced by the .ci scripts, never run: the one place that installs Debian packages. As root
# (a fresh Debian machine) it runs apt-get directly, otherwise through sudo.
#
#   . "$(dirname "$0")/lib.sh"
#   need_command protoc protobuf-compiler
#   need_file /usr/include/google/protobuf/descriptor.proto libprotobuf-dev
#   install_needed

# The packages that need_command and need_file found missing, for install_needed.
need=()

# need_command COMMAND PACKAGE: PACKAGE is needed when COMMAND is not on PATH.
need_command() {
  command -v "$1" >/dev/null || need+=("$2")
}

# need_file FILE PACKAGE: PACKAGE is needed when FILE is missing.
need_file() {
  [ -f "$1" ] || need+=("$2")
}

# as_root COMMAND [ARG...]: runs the command directly when root, else with sudo.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  else
    sudo "$@"
  fi
}

# apt_update: reads the archive's package lists (a fresh machine may not have them yet).
apt_update() {
  as_root apt-get update -qq
}

# apt_install PACKAGE...: reads the package lists, then installs the packages without their
# recommendations, quietly and without questions (DEBIAN_FRONTEND is set inside sudo, which
# would otherwise drop it). Nothing to do without arguments.
apt_install() {
  [ $# -gt 0 ] || return 0
  echo "installing: $*"
  apt_update
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# install_needed: installs what need_command and need_file found missing, if anything.
install_needed() {
  [ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"
}
