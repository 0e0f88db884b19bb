#!/usr/bin/env bash
# The JPEG region decoder (trainfeed/decode/_jpeg_region.c) under AddressSanitizer and UBSan:
#   1. builds it a second time with -fsanitize=address,undefined into a scratch copy of the
#      package (the normal build in trainfeed/decode/ is never touched) and runs its tests there;
#   2. fuzzes every entry point's C core, coverage-guided (libFuzzer: tools/fuzz/), from a seed
#      corpus that tools/fuzz/seeds.py generates.
# Any sanitizer report, crash, leak (in the fuzzer), timeout or failed test exits non-zero.
#
#   tools/sanitize_jpeg_region.sh [FUZZ_SECONDS]      (default 180; about 4-5 min in all)
#
# Needs gcc, clang (clang-14 on Debian 12, or $CLANG), libclang-rt-14-dev (libFuzzer),
# libjpeg-dev and the test environment's python3: .ci/run installs them. Run from any folder.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=${1:-180}
clang=${CLANG:-$(command -v clang-14 || command -v clang || true)}
[[ -n "$clang" ]] || { echo "sanitize: no clang (apt-get install clang-14 libclang-rt-14-dev)"; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/sanitize-jpeg-region.XXXXXX")
trap 'rm -rf "$work"' EXIT
reports="$work/reports"
mkdir -p "$reports" "$work/tree" "$work/corpus"
say() { printf '\n--- sanitize: %s\n' "$*"; }
fail_on_reports() {  # a report in a child process may not fail its test: it fails here
  if compgen -G "$reports/*" >/dev/null; then
    say "sanitizer reports ($1):"
    cat "$reports"/*
    exit 1
  fi
}

# --- 1. the extension's tests against its ASan + UBSan build -----------------------------------
say "building the extension with -fsanitize=address,undefined into $work/tree"
tar --exclude=__pycache__ --exclude='*.so' -cf - trainfeed tests pyproject.toml | tar -xf - -C "$work/tree"
include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
so="$work/tree/trainfeed/decode/_jpeg_region$suffix"
gcc -shared -fPIC -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
  -fno-sanitize-recover=all -Wall -Wextra -I"$include" trainfeed/decode/_jpeg_region.c -ljpeg -o "$so"
grep -q __asan_init "$so" || { echo "sanitize: $so has no ASan"; exit 1; }

# Python itself is not instrumented: ASan's runtime must come first (LD_PRELOAD). Python keeps
# objects alive until exit by design, so leaks are checked in the fuzzer only (below).
asan_runtime=$(gcc -print-file-name=libasan.so)
(
  cd "$work/tree"
  export PYTHONPATH="$work/tree" LD_PRELOAD="$asan_runtime"
  export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$reports/asan"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"
  loaded=$(python3 -c 'import trainfeed.decode._jpeg_region as m; print(m.__file__)')
  [[ "$loaded" == "$so" ]] || { echo "sanitize: the tests would load $loaded, not $so"; exit 1; }
  say "tests of the extension under ASan + UBSan"
  python3 -m pytest -q -p no:cacheprovider tests/decode/test_jpeg_region.py \
    tests/decode/test_jpeg_region_safety.py tests/decode/test_jpeg_restarts.py \
    tests/decode/test_decode_roi.py tests/decode/test_image.py
) || { fail_on_reports "tests"; exit 1; }
fail_on_reports "tests"

# --- 2. coverage-guided fuzzing of every entry point ------------------------------------------
# The harness and any crashing input stay in build/ (git-ignored): replay one with
#   build/sanitize-jpeg-region/fuzz_jpeg_region build/sanitize-jpeg-region/crash-...
artifacts="$PWD/build/sanitize-jpeg-region"
mkdir -p "$artifacts"
say "building the libFuzzer harness with $clang"
"$clang" -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=all tools/fuzz/fuzz_jpeg_region.c -ljpeg -o "$artifacts/fuzz_jpeg_region"
python3 tools/fuzz/seeds.py "$work/seeds"
say "fuzzing for ${fuzz_seconds} s (leaks checked; a crashing input goes to $artifacts/)"
ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
  "$artifacts/fuzz_jpeg_region" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=200000 -print_final_stats=1 -artifact_prefix="$artifacts/" "$work/corpus" "$work/seeds" \
  2>&1 | grep -v '^#[0-9]*.*\(NEW\|REDUCE\|pulse\)'
say "no sanitizer report: $(find "$work/corpus" -type f | wc -l) inputs in the corpus"
