#!/bin/sh
# Checks that kiln's binaries run on any x86-64-v2 processor: instructions beyond
# x86-64-v2 appear only in the dispatched kernels, each level's only in its own unit.
#
#   check_isa.sh BUILD_DIR [BASELINE]
#
# BASELINE is the -march the build used outside the dispatched kernels; anything but
# x86-64-v2 (KILN_NATIVE, KILN_ARCH or -march in CMAKE_CXX_FLAGS) is reported as skipped
# (exit 77), since such binaries are not meant to run everywhere.
#
# 1. Every function of libkiln.so and of the executables is disassembled. Outside
#    kiln::math::avx2:: and kiln::math::avx512:: no instruction may be VEX/EVEX-encoded
#    (a mnemonic starting with "v", or ymm/zmm/mask registers) or from BMI/LZCNT/MOVBE
#    (tzcnt is allowed: GCC writes it for bsf, which older processors run as such);
#    inside kiln::math::avx2:: nothing may be AVX-512 (zmm, mask registers, xmm16-31).
#    This sees the linked result, so a weak function compiled for a level and kept by the
#    linker in place of the baseline copy is caught too.
# 2. The level units' objects define no weak or global symbol outside their own namespace,
#    so no such merge can happen in the first place.
set -eu
build=${1:?usage: check_isa.sh BUILD_DIR [BASELINE]}
baseline=${2:-x86-64-v2}
if [ "$baseline" != "x86-64-v2" ]; then
  echo "check_isa: skipped: this build's baseline is '$baseline', not x86-64-v2"
  exit 77
fi
status=0

binaries="$build/libkiln.so"
for exe in tools/onnx-run tools/kiln-generate tools/kiln-bench tools/kiln-rss tools/kiln-ops-doc \
           test/kiln-unit-tests test/kiln-conformance test/kiln-json-check; do
  [ -f "$build/$exe" ] && binaries="$binaries $build/$exe"
done

for bin in $binaries; do
  objdump -d -C --no-show-raw-insn "$bin" | awk -v bin="$bin" '
    /^[0-9a-f]+ <.*>:$/ {
      fn = substr($0, index($0, "<") + 1); sub(/>:$/, "", fn)
      level = "base"
      if (index(fn, "kiln::math::avx512::")) level = "avx512"
      else if (index(fn, "kiln::math::avx2::")) level = "avx2"
      next
    }
    /^ *[0-9a-f]+:\t/ {
      insn = $0; sub(/^ *[0-9a-f]+:\t/, "", insn)
      split(insn, parts, /[ \t]+/); m = parts[1]
      if (level == "avx512") next
      avx512 = (insn ~ /%zmm|%k[0-7]|\{%k|%[xy]mm(1[6-9]|2[0-9]|3[01])/)
      if (level == "avx2") {
        if (avx512) { print bin ": AVX-512 in an avx2 kernel: " fn ": " insn; bad++ }
        next
      }
      vex = (m ~ /^v/ && m !~ /^(verr|verw|vmcall|vmlaunch|vmresume|vmxoff|vmxon|vmread|vmwrite|vmptrld|vmptrst|vmclear|vmfunc)$/)
      bmi = (m ~ /^(andn|bextr|blsi|blsmsk|blsr|bzhi|mulx|pdep|pext|rorx|sarx|shlx|shrx|lzcnt|movbe)$/)
      if (avx512 || vex || bmi || insn ~ /%ymm/) {
        if (shown[fn]++ == 0) print bin ": beyond x86-64-v2 outside the dispatched kernels: " fn ": " insn
        bad++
      }
    }
    END { exit bad > 0 }' || status=1
done

for level in generic avx2 avx512; do
  for obj in "$build"/ops/math/CMakeFiles/kiln_isa_$level.dir/*.o; do
    [ -f "$obj" ] || { echo "check_isa: no objects for level $level under $build"; status=1; continue; }
    nm -C --defined-only "$obj" | awk -v obj="$obj" -v ns="kiln::math::$level::" '
      $2 ~ /^[TWVuDBR]$/ {
        name = $0; sub(/^[0-9a-f]* *[A-Za-z] /, "", name)
        if (!index(name, ns)) { print obj ": symbol outside " ns ": " name; bad++ }
      }
      END { exit bad > 0 }' || status=1
  done
done

if [ "$status" -eq 0 ]; then
  echo "check_isa: ok ($(echo $binaries | wc -w) binaries; levels generic, avx2, avx512)"
fi
exit $status
