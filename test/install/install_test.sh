#!/bin/sh
# The installed kiln, as a user gets it: `cmake --install BUILD --prefix P` into a temporary
# prefix, the tree's files, an installed tool running from there, then the out-of-tree
# consumer (test/install/consumer) built against P with find_package(kiln) and again with
# pkg-config, each run on models/tiny-cnn.
#
#   install_test.sh BUILD_DIR SOURCE_DIR
set -eu
build=${1:?usage: install_test.sh BUILD_DIR SOURCE_DIR}
src=${2:?usage: install_test.sh BUILD_DIR SOURCE_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
model=$src/models/tiny-cnn/model.onnx

fail() {
  echo "install_test: $*" >&2
  exit 1
}

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log" >&2
  fail "cmake --install failed"
}
for f in include/kiln/kiln.h include/kiln/session.h include/kiln/generate.h lib/libkiln.so \
         lib/cmake/kiln/kilnConfig.cmake lib/cmake/kiln/kilnConfigVersion.cmake \
         lib/cmake/kiln/kilnTargets.cmake lib/pkgconfig/kiln.pc \
         bin/onnx-run bin/kiln-generate bin/kiln-bench; do
  [ -e "$prefix/$f" ] || fail "missing from the install tree: $f"
done
# Nothing but the public headers is installed.
extra=$(cd "$prefix/include" && find . -type f ! -path './kiln/*.h')
[ -z "$extra" ] || fail "unexpected files under include/: $extra"

# The installed tool finds the installed library (its RPATH), not the build tree's.
ldd "$prefix/bin/onnx-run" | grep -q "$prefix/bin/../lib/libkiln.so" ||
  fail "bin/onnx-run does not load lib/libkiln.so from the install tree: $(ldd "$prefix/bin/onnx-run" | grep kiln)"
"$prefix/bin/onnx-run" "$model" --test-data "$src/models/tiny-cnn/test_data_set_0" >/dev/null ||
  fail "the installed onnx-run failed on tiny-cnn"

# find_package(kiln) -> kiln::kiln
cmake -S "$src/test/install/consumer" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/configure.log" 2>&1 || {
  cat "$tmp/configure.log" >&2
  fail "configuring the consumer with find_package(kiln) failed"
}
cmake --build "$tmp/cmake-build" >"$tmp/build.log" 2>&1 || {
  cat "$tmp/build.log" >&2
  fail "building the consumer with find_package(kiln) failed"
}
"$tmp/cmake-build/kiln-consumer" "$model" || fail "the CMake-built consumer failed"

# pkg-config: the same source, one compiler command.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
flags=$(pkg-config --cflags --libs kiln) || fail "pkg-config does not find kiln"
c++ -std=c++20 -o "$tmp/kiln-consumer-pc" "$src/test/install/consumer/main.cpp" $flags \
  -Wl,-rpath,"$prefix/lib" || fail "building the consumer with pkg-config failed"
"$tmp/kiln-consumer-pc" "$model" || fail "the pkg-config-built consumer failed"
echo "install_test: ok"
