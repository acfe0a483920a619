#!/usr/bin/env bash
# The one command to see lead-exec work on a fresh Debian machine:
#
#     bash examples/demo.sh [--ledger sqlite|postgres]
#
# Installs what is missing (etcd-server for a throwaway etcd; protobuf-compiler and
# libprotobuf-dev, whose well-known .proto files etcd-client's build imports), then builds
# and runs the narrated demo (examples/demo/), about 15 seconds once built. The ledger is a
# throwaway PostgreSQL if Debian's `postgresql` package is installed, else SQLite; this script
# does not install PostgreSQL.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=()
command -v etcd >/dev/null 2>&1 || packages+=(etcd-server)
command -v protoc >/dev/null 2>&1 || packages+=(protobuf-compiler)
# Only a recommended package of protobuf-compiler: --no-install-recommends leaves it out.
[[ -f /usr/include/google/protobuf/descriptor.proto ]] || packages+=(libprotobuf-dev)

if ((${#packages[@]})); then
    if [[ $(id -u) -eq 0 ]]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        echo "demo.sh: need root or sudo to install: ${packages[*]}" >&2
        exit 1
    fi
    echo "demo.sh: installing ${packages[*]}"
    "${as_root[@]}" apt-get update -q
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "demo.sh: cargo not found: install the Rust toolchain (rustup) first" >&2
    exit 1
fi

exec cargo run --release --example demo -- "$@"
