#!/bin/sh
# Builds the kiln Python package's sdist (OUTDIR, default dist/) with kiln's C++ sources
# inside it, and checks what it holds. scikit-build-core packs only the project folder
# (python/), whose CMakeLists.txt builds the library from the folder above it; so the sdist
# is made from a staged copy: python/'s tracked files, with the C++ tree (CMakeLists.txt,
# cmake/, proto/, engine/, ops/) as kiln-src/ beside them, which python/CMakeLists.txt and the
# version lookup in pyproject.toml use when present. `pip install kiln-VERSION.tar.gz` then
# builds anywhere the Debian packages of tools/setup.sh are installed.
# Usage: tools/python-sdist.sh [OUTDIR] [--wheel]   (--wheel: also build a wheel from it)
set -eu
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
venv=${VENV:-.venv}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

mkdir -p "$stage/kiln/kiln-src" "$out"
git ls-files -z python | (cd python && xargs -0 -I{} sh -c 'f="{}"; f=${f#python/}; mkdir -p "$0/$(dirname "$f")"; cp "$f" "$0/$f"' "$stage/kiln")
git ls-files -z CMakeLists.txt cmake proto engine ops | xargs -0 cp --parents -t "$stage/kiln/kiln-src"
sed -i 's|^input = "../CMakeLists.txt"$|input = "kiln-src/CMakeLists.txt"|' "$stage/kiln/pyproject.toml"
grep -q '^input = "kiln-src/CMakeLists.txt"$' "$stage/kiln/pyproject.toml" ||
  { echo "python-sdist: pyproject.toml's version input is not ../CMakeLists.txt" >&2; exit 1; }

# Without isolation: the venv's pinned scikit-build-core and pybind11, nothing downloaded.
"$venv/bin/python" -m build --sdist --no-isolation --outdir "$stage/dist" "$stage/kiln" \
  >"$stage/build.log" 2>&1 || { cat "$stage/build.log" >&2; exit 1; }
sdist=$(ls "$stage"/dist/kiln-*.tar.gz)
name=$(basename "$sdist" .tar.gz)

# What the build needs: the package, the module's sources, the library's sources and CMake.
tar tzf "$sdist" >"$stage/contents"
for f in PKG-INFO pyproject.toml CMakeLists.txt kiln/__init__.py kiln/serve/__init__.py \
         src/module.cpp kiln-src/CMakeLists.txt kiln-src/cmake/install.cmake \
         kiln-src/proto/CMakeLists.txt kiln-src/engine/include/kiln/kiln.h \
         kiln-src/ops/CMakeLists.txt kiln-src/ops/math/CMakeLists.txt; do
  grep -qx "$name/$f" "$stage/contents" || { echo "python-sdist: $f is missing from $name" >&2; exit 1; }
done
for dir in engine ops proto; do
  want=$(git ls-files "$dir" | wc -l)
  have=$(grep -c "^$name/kiln-src/$dir/.*[^/]$" "$stage/contents")
  [ "$want" -eq "$have" ] || { echo "python-sdist: $name has $have of $want files of $dir/" >&2; exit 1; }
done
cp "$sdist" "$out/"
echo "python-sdist: $out/$name.tar.gz ($(wc -l <"$stage/contents") entries)"

if [ "${2:-}" = "--wheel" ]; then
  "$venv/bin/pip" wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps \
    -w "$out" "$out/$name.tar.gz"
  echo "python-sdist: $(ls "$out"/kiln-*.whl)"
fi
