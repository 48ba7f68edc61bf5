#!/usr/bin/env bash
# Builds the test programs with AddressSanitizer and UndefinedBehaviorSanitizer (GCC) into
# build-asan/ and runs the unit and parity tests under them; any report fails the run.
#   bash scripts/sanitize.sh [extra ctest arguments]
# Left out, and why: every test that loads the sentencepiece wrapper (tokenizer, data
# preparation, training, minimind-eval): the wrapper is dlopen'ed with RTLD_DEEPBIND to keep
# its bundled protobuf apart from libtorch's (data/spm_shim.h), and the ASan runtime refuses
# RTLD_DEEPBIND. LibTorch itself is not instrumented: its own code is not checked, only ours
# and what it does to our memory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
if [ ! -f build-asan/build.ninja ]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMINIMIND_WERROR=OFF \
    -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined"
fi
TESTS=(config_tests model_tests module_tests run_log_tests parity_tests)
cmake --build build-asan -j "${JOBS:-$(nproc)}" --target "${TESTS[@]}"
cd build-asan
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Only the programs above were built, so only their tests are listed (the parity fixtures
# come from the Python reference, as in the normal suite).
ctest --output-on-failure -j "$(nproc)" -L 'unit|parity' -E '^layering_|^format$' "$@"
