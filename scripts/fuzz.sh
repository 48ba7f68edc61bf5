#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, with AddressSanitizer and UndefinedBehaviorSanitizer)
# into build-fuzz/ and runs each on its seed corpus:
#   bash scripts/fuzz.sh [RUNS [SECONDS [TARGET...]]]
# runs each target (default: all) until RUNS executions (default 1000000) or SECONDS
# (default 600), whichever comes first.
# New inputs found are kept in build-fuzz/corpus/<target>/; a crash stops with the input
# saved as build-fuzz/crash-* and a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-1000000}
SECONDS_PER_TARGET=${2:-600}
bash scripts/install-deps.sh
FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMINIMIND_BUILD_TESTS=OFF -DMINIMIND_BUILD_FUZZERS=ON -DMINIMIND_WERROR=OFF \
    -DCMAKE_CXX_FLAGS="$FLAGS"
fi
TARGETS=(config corpus token_file state_json weights run_log tokenizer_json tokenizer_config tokenizer_text)
if [ $# -gt 2 ]; then TARGETS=("${@:3}"); fi
cmake --build build-fuzz -j "${JOBS:-$(nproc)}" --target "${TARGETS[@]/#/fuzz_}"
# allocator_may_return_null: an impossible allocation is a bad_alloc the code handles, as in
# a normal build, not an ASan report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:halt_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TMPDIR=${TMPDIR:-/dev/shm}
cd build-fuzz
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t"
  # A damaged pickle may declare a string of up to 4 GB: LibTorch's unpickler allocates it
  # before it finds the file too short and throws. Room for that (fuzz_weights.cpp), and no
  # limit on one allocation: one that cannot be had is a bad_alloc, handled.
  # (alloc_dealloc_mismatch=0: the replaced operator new is malloc underneath.)
  RSS=2048 MALLOC=2048 EXTRA=
  if [ "$t" = weights ]; then RSS=20000 MALLOC=100000000 EXTRA=:alloc_dealloc_mismatch=0; fi
  echo "fuzz_$t: up to $RUNS runs or $SECONDS_PER_TARGET s"
  # The fuzzer's own status decides (a grep that finds nothing must not hide a failure).
  set +e
  ASAN_OPTIONS="$ASAN_OPTIONS$EXTRA" "./tests/fuzz/fuzz_$t" -runs="$RUNS" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 \
    -rss_limit_mb=$RSS -malloc_limit_mb=$MALLOC -timeout=60 \
    -print_final_stats=1 "corpus/$t" "../tests/fuzz/seeds/$t" 2>&1 |
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)|ERROR|SUMMARY|==[0-9]+=="
  status=${PIPESTATUS[0]}
  set -e
  test "$status" -eq 0 || { echo "fuzz_$t FAILED (exit $status; the input is saved in build-fuzz/)" >&2; exit 1; }
done
