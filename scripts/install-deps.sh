#!/usr/bin/env bash
# Installs every system package minimind-cpp needs, from Debian's apt repositories only.
# Idempotent: packages already present are left alone; safe to run again. Installing needs
# root; with every package present it exits 0 for any user, and a non-root user with some
# missing is told which ones and the command that installs them.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake pkg-config ninja-build
  # the test suite checks the tree against .clang-format; scripts/fuzz.sh builds with clang's
  # libFuzzer and sanitizers
  clang-format clang libclang-rt-14-dev
  # C++ libraries
  libtorch-dev libcli11-dev libspdlog-dev libfmt-dev libyaml-cpp-dev
  libsentencepiece-dev sentencepiece libgtest-dev libgmock-dev
  nlohmann-json3-dev libxxhash-dev libgloo-dev zlib1g-dev
  # ICU's regex engine: the pre-tokenizer of a Hugging Face tokenizer.json (docs/data.md)
  libicu-dev
  # oneDNN, the library libtorch_cpu already loads: minimind-bench measures its matmul peaks
  libdnnl-dev
  # tcmalloc, the programs' malloc (docs/performance.md, "Memory allocator")
  libtcmalloc-minimal4
  # An optimised BLAS: Debian's default libblas.so.3 is the reference BLAS (~4 GFLOP/s
  # for fp32 matmul here, versus ~100 GFLOP/s with OpenBLAS). See docs/performance.md.
  libopenblas0-pthread
  # Python reference (tests/reference): Debian's torch shares libtorch_cpu with LibTorch.
  python3 python3-torch python3-numpy python3-sentencepiece python3-yaml
  # Chat templates rendered as transformers renders them (tests/reference/chat_ref.py)
  python3-jinja2
  # TensorBoard's event files are decoded by classes protoc builds (tests/reference);
  # inspect --follow is tested in a real terminal
  protobuf-compiler python3-protobuf tmux
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: ${#missing[@]} of ${#PACKAGES[@]} packages are missing: ${missing[*]}" >&2
  echo "install-deps: as root, run: apt-get install --no-install-recommends ${missing[*]}" >&2
  echo "install-deps: (or: sudo bash scripts/install-deps.sh)" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
