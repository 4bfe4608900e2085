#!/bin/sh
# Installs kiln's build and test dependencies: the missing Debian packages, then the project
# venv (.venv) with the Python package's pinned build and test requirements
# (python/requirements-test.txt, which includes requirements-build.txt and
# requirements-serve.txt). Idempotent: prints what it installs, or that nothing was needed.
set -eu
cd "$(dirname "$0")/.."

packages="cmake g++ make ninja-build zlib1g-dev libprotobuf-dev protobuf-compiler libonnx-dev libeigen3-dev libtbb-dev nlohmann-json3-dev libcli11-dev libsndfile1-dev libsoxr-dev catch2 clang-format clang libclang-rt-14-dev pkgconf python3-dev python3-venv"

install_packages() {
  missing=""
  for p in $packages; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing="$missing $p"
    fi
  done

  if [ -z "$missing" ]; then
    echo "setup: all dependencies are installed"
    return
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
}

# Debian's Python (python3-dev has its headers, which the extension module compiles against).
# Made again when the requirements change (a stamp keeps their checksum).
make_venv() {
  venv=.venv
  wanted=$(cat python/requirements-*.txt | sha256sum | cut -d' ' -f1)
  if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements" 2>/dev/null)" = "$wanted" ]; then
    echo "setup: $venv is up to date"
    return
  fi
  echo "setup: making $venv (python/requirements-test.txt)"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r python/requirements-test.txt
  echo "$wanted" >"$venv/.requirements"
}

install_packages
make_venv
