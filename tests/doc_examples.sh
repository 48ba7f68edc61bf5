#!/usr/bin/env bash
# Every command in the ```sh blocks of README.md and docs/*.md runs as written, with the
# programs of this build first on PATH, in a scratch directory that holds what a fresh
# clone after Quick start holds (scripts/, data/ and a trained runs/moe), and a MiniMind clone
# for the examples that use one (with a checkpoint made by the reference model). Training
# commands get short --set overrides appended (the page's own values come first, so ours win).
# Output a page shows, in a ```text block after `<!-- output of: COMMAND -->`, must come
# from the current program: each of its lines, numbers, durations and histogram glyphs
# aside, must be a line of COMMAND's output.
# Not run: the two Quick start commands, scripts/build.sh and ctest (this test suite runs
# them), `sudo` lines, and torchrun (several machines; Debian's torchrun crashes on this one).
# Usage: doc_examples.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PATH="$BUILD/app:$PATH"
export MASTER_PORT=$((29700 + RANDOM % 200))
SHORT=(--set train.max_steps=4 --set train.warmup_steps=0 --set train.eval_interval=2
  --set train.checkpoint_interval=2 --set data.max_seq_len=64 --set train.batch_size=4
  --set log.interval=2)

cd "$WORK"
ln -s "$SRC/scripts" scripts
ln -s "$SRC/data" data
# What the MiniMind examples expect beside the directory: a clone minimind/ with its
# tokenizer, a MiniMind-3 MoE checkpoint (the reference model's, of the real size) and data.
mkdir -p minimind/model minimind/out minimind/dataset
cp "$SRC"/tests/data/minimind-tokenizer/tokenizer*.json minimind/model/
cp "$SRC/tests/data/tokenizer-corpus.jsonl" minimind/dataset/pretrain_hq.jsonl
cp "$SRC/tests/data/chat-corpus.jsonl" minimind/dataset/sft_mini_512.jsonl
/usr/bin/python3 "$SRC/tests/reference/check_minimind_checkpoint.py" make \
  "$SRC/configs/minimind-3-moe.yaml" minimind/out/pretrain_768_moe.pth 1
# What Quick start's first command leaves: a trained runs/moe (shortened here).
minimind-train --config moe.yaml "${SHORT[@]}" > /dev/null 2> quickstart.err ||
  { cat quickstart.err >&2; exit 1; }

pages=("$SRC/README.md" "$SRC"/docs/*.md)
/usr/bin/python3 - "${pages[@]}" > commands.txt <<'PY'
import re, sys
for page in sys.argv[1:]:
    text = open(page, encoding="utf-8").read()
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for cmd in re.sub(r"\\\n\s*", " ", block).splitlines():
            cmd = cmd.split("  #")[0].strip()
            if cmd and not cmd.startswith("#"):
                print(f"{page}\t{cmd}")
PY
ran=0
while IFS=$'\t' read -r page cmd; do
  case "$cmd" in
    "bash scripts/run-default.sh"* | "bash scripts/test.sh"* | "bash scripts/build.sh"* | *"ctest "* | torchrun* | sudo*)
      echo "skipped: $cmd"
      continue
      ;;
    "minimind-train --config moe.yaml")  # Quick start's run, made above as runs/moe
      echo "made above: $cmd"
      continue
      ;;
  esac
  full=$cmd
  if [[ $cmd == *minimind-train* && $cmd != *--print-config* && $cmd != *--list-presets* ]]; then
    full="$cmd ${SHORT[*]}"
  fi
  # "cd build && ..." (the development page) runs in this build's directory.
  full=${full//cd build/cd $BUILD}
  echo "running (${page#"$SRC"/}): $full"
  if ! bash -c "$full" < /dev/null > out.txt 2> err.txt; then
    echo "FAIL: ${page#"$SRC"/}: command failed: $cmd" >&2
    tail -5 err.txt >&2
    exit 1
  fi
  ran=$((ran + 1))
done < commands.txt
test "$ran" -ge 20 || { echo "FAIL: only $ran commands ran" >&2; exit 1; }
echo "docs: $ran commands ran as written"

# Output the pages show, against the current programs.
/usr/bin/python3 - "$BUILD" "${SHORT[*]}" "${pages[@]}" <<'PY'
import re, subprocess, sys
build, short, pages = sys.argv[1], sys.argv[2], sys.argv[3:]

def skeleton(line):
    line = re.sub(r"\b(\d+h)?(\d+m)?\d+s\b", "<t>", line)         # durations
    line = re.sub(r"[▁▂▃▄▅▆▇█·]+", "<bars>", line)                  # histograms
    line = re.sub(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?%?", "<n>", line)  # numbers
    return " ".join(line.split())

checked = failed = 0
for page in pages:
    text = open(page, encoding="utf-8").read()
    for cmd, block in re.findall(r"<!-- output of: (.*?) -->\n```text\n(.*?)```", text, re.S):
        full = cmd + (" " + short if "minimind-train" in cmd else "")
        run = subprocess.run(["bash", "-c", full], capture_output=True, text=True)
        have = {skeleton(l) for l in (run.stdout + run.stderr).splitlines()}
        for line in block.splitlines():
            checked += 1
            if skeleton(line) not in have:
                failed += 1
                print(f"FAIL: {page}: shown output of `{cmd}` is not what it prints now:\n  {line}")
print(f"docs: {checked} lines of shown output checked, {failed} differ")
sys.exit(1 if failed or checked == 0 else 0)
PY
