#!/bin/sh
# Installs kiln's build and test dependencies from Debian packages, only those missing.
# Idempotent: prints what it installs, or that nothing was needed.
set -eu

packages="cmake g++ make zlib1g-dev libprotobuf-dev protobuf-compiler libonnx-dev libeigen3-dev libtbb-dev nlohmann-json3-dev libcli11-dev libsndfile1-dev libsoxr-dev catch2 clang-format clang libclang-rt-14-dev"

missing=""
for p in $packages; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done

if [ -z "$missing" ]; then
  echo "setup: all dependencies are installed"
  exit 0
fi

echo "setup: installing:$missing"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "setup: need root (or sudo) to install:$missing" >&2
    exit 1
  fi
else
  SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
echo "setup: done"
