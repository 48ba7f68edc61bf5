"""Every link and cited path in the docs and in the code's comments resolves inside the tree.

Walks README.md, CHANGELOG.md and docs/**/*.md, the dated reports in docs/benchmarks/
included (Markdown links and images, with their #anchors checked against the target's
headings, and paths of the tree cited in the text), and the comments of src/, app/ and
tests/ (a docs/ page, README.md or CHANGELOG.md). Fails on a missing file, a missing
anchor, or a relative path that leaves the repository.
Usage: check_links.py SOURCE_DIR
"""
import os
import re
import subprocess
import sys

root = os.path.realpath(sys.argv[1])
errors = []


def anchors(md_path):
    """GitHub's anchors for the headings of a Markdown file."""
    out = set()
    in_code = False
    for line in open(md_path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        title = re.sub(r"[^\w\- ]", "", title)  # punctuation goes, word characters stay
        out.add(title.replace(" ", "-"))
    return out


def inside(path):
    return os.path.realpath(path).startswith(root + os.sep) or os.path.realpath(path) == root


def check_target(where, base_dir, target):
    if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
        return
    path, _, anchor = target.partition("#")
    full = os.path.normpath(os.path.join(base_dir, path)) if path else where_file[where]
    if not inside(full):
        errors.append(f"{where}: {target} points outside the repository")
        return
    if not os.path.exists(full):
        errors.append(f"{where}: {target} does not exist")
        return
    if anchor and full.endswith(".md") and anchor not in anchors(full):
        errors.append(f"{where}: no heading for #{anchor} in {os.path.relpath(full, root)}")


where_file = {}
md_files = [os.path.join(root, f) for f in ("README.md", "CHANGELOG.md")]
for dirpath, _, files in os.walk(os.path.join(root, "docs")):
    md_files += [os.path.join(dirpath, f) for f in files if f.endswith(".md")]
link = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
checked = 0
for md in md_files:
    if not os.path.exists(md):
        errors.append(f"{os.path.relpath(md, root)} is missing")
        continue
    in_code = False
    for n, line in enumerate(open(md, encoding="utf-8"), 1):
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        for target in link.findall(line):
            where = f"{os.path.relpath(md, root)}:{n}"
            where_file[where] = md
            check_target(where, os.path.dirname(md), target)
            checked += 1
        for rel in re.findall(r"\.\./[\w./-]+", line):
            if not inside(os.path.join(os.path.dirname(md), rel)):
                errors.append(f"{os.path.relpath(md, root)}:{n}: {rel} leaves the repository")

# Paths of the tree cited in the pages' prose (`src/.../x.h`, scripts/bench.sh, ...), from the
# repository root. A path followed by "at commit HASH" cites a file as it was then (a dated
# report on code since removed): it must exist in that commit when git can tell.
tree_path = re.compile(
    r"(?<![\w./-])((?:src|app|tests|scripts|configs|docs|data|\.ci)/[\w./-]*[\w-]"
    r"\.(?:h|cpp|py|sh|md|yaml|txt|jsonl|mjs|json|cmake|png))(?:\s+at commit ([0-9a-f]{7,40}))?")
has_git = os.path.isdir(os.path.join(root, ".git"))
for md in md_files:
    if not os.path.exists(md):
        continue
    for n, line in enumerate(open(md, encoding="utf-8"), 1):
        for rel, commit in tree_path.findall(line):
            where = f"{os.path.relpath(md, root)}:{n}"
            checked += 1
            if commit:
                # Checked where the commit is known (a shallow clone may not have it).
                def known(obj):
                    return has_git and subprocess.run(["git", "-C", root, "cat-file", "-e", obj],
                                                      capture_output=True).returncode == 0
                if known(commit + "^{commit}") and not known(f"{commit}:{rel}"):
                    errors.append(f"{where}: {rel} is not in commit {commit}")
            elif not os.path.exists(os.path.join(root, rel)):
                errors.append(f"{where}: {rel} does not exist (a file since removed is cited "
                              "as 'PATH at commit HASH')")

# Comments in the code: the docs they cite, by path from the repository root.
cited = re.compile(r"((?:\.\./)*(?:docs/[\w./-]+\.md|README\.md|CHANGELOG\.md)(?:#[\w-]+)?)")
comment = re.compile(r"(//.*|#.*|/\*.*|^\s*\*.*)")
for top in ("src", "app", "tests"):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        if "/fuzz/seeds" in dirpath or "/data/" in dirpath + "/" or "node_modules" in dirpath:
            continue
        for f in files:
            if not f.endswith((".h", ".cpp", ".py", ".sh", ".txt")):
                continue
            path = os.path.join(dirpath, f)
            for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                for c in comment.findall(line):
                    for target in cited.findall(c):
                        where = f"{os.path.relpath(path, root)}:{n}"
                        where_file[where] = path
                        if target.startswith("../"):
                            errors.append(f"{where}: {target} leaves the repository")
                            continue
                        check_target(where, root, target)
                        checked += 1
                    for rel in re.findall(r"\.\./[\w./-]+", c):
                        if not inside(os.path.join(dirpath, rel)):
                            errors.append(f"{os.path.relpath(path, root)}:{n}: {rel} leaves the "
                                          "repository")

for e in errors:
    print("FAIL: " + e)
print(f"links: {checked} checked, {len(errors)} broken")
sys.exit(1 if errors else 0)
