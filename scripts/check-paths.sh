#!/usr/bin/env bash
# Fails when a tracked file refers to a path outside the repository: a clone must build, test
# and document itself with nothing beside it.
#
# What counts as such a reference, in any tracked text file:
#   1. a relative path with `..` segments that climbs above the repository's root. It is
#      resolved from the directory a reader of that file would start in: a Rust source's or
#      a manifest's crate (the nearest folder above it with a Cargo.toml, as
#      CARGO_MANIFEST_DIR), any other file's own folder. A leading `/` is read as the tail of
#      a concatenation (`concat!(env!("CARGO_MANIFEST_DIR"), "/../x")`), not as the root.
#   2. a path into a folder that sits beside the repository on a developer's machine but not
#      in a clone (`shared/...`), unless that path exists in the repository.
#   3. an absolute path into this workplace's checkout folder (`/work/...`).
# A line that must name such a path on purpose (an example in a doc) carries the marker
# `check-paths: allow`.
#
# Usage: scripts/check-paths.sh            check this repository (exit 1 and a list if any)
#        scripts/check-paths.sh --self-test show that the check fails on each kind of reference
set -euo pipefail

# Folders that sit beside the repository on a developer's machine, never in a clone.
SIBLINGS_RE='(^|[^A-Za-z0-9_.-])(shared)/[A-Za-z0-9_.-]'

check_repo() {
  local root="$1"
  cd "$root"
  local bad=0 file base crate line tok rel resolved
  while IFS= read -r -d '' file; do
    # This script spells out the references it looks for in its self-test.
    case "$file" in Cargo.lock | */Cargo.lock | scripts/check-paths.sh) continue ;; esac
    [ -f "$file" ] || continue
    # Text files only (grep -I treats a binary as not matching).
    grep -Iq . "$file" 2>/dev/null || continue
    base=$(dirname "$file")
    case "$file" in
      *.rs | *Cargo.toml)
        crate="$base"
        while [ "$crate" != "." ] && [ ! -f "$crate/Cargo.toml" ]; do crate=$(dirname "$crate"); done
        base="$crate" ;;
    esac
    # 1. Relative paths that climb out.
    while IFS= read -r line; do
      case "$line" in *"check-paths: allow"*) continue ;; esac
      while IFS= read -r tok; do
        [ -n "$tok" ] || continue
        rel="${tok#/}"
        resolved=$(realpath -m --relative-base="$root" "$root/$base/$rel")
        case "$resolved" in
          /*) echo "$file: '$tok' leads outside the repository (to $resolved)"; bad=1 ;;
        esac
      done < <(grep -oE '[A-Za-z0-9_./-]*(\.\./|/\.\.)[A-Za-z0-9_./-]*' <<<"$line" || true)
    done < <(grep -E '\.\./|/\.\.' "$file" || true)
    # 2. Paths into sibling folders, 3. into the workplace's checkout folder.
    while IFS= read -r line; do
      case "$line" in *"check-paths: allow"*) continue ;; esac
      while IFS= read -r tok; do
        [ -n "$tok" ] || continue
        tok="${tok#[^A-Za-z0-9_.-]}"
        tok="${tok%%[.,:;]}"
        if [ ! -e "$root/$tok" ] && [ ! -e "$root/$base/$tok" ]; then
          echo "$file: '$tok' names a folder beside the repository, absent from a clone"; bad=1
        fi
      done < <(grep -oE "$SIBLINGS_RE[A-Za-z0-9_./-]*" <<<"$line" || true)
      if grep -qE '(^|[^A-Za-z0-9_.-])/work/' <<<"$line"; then
        echo "$file: an absolute path into /work/: $(grep -oE '/work/[A-Za-z0-9_./-]*' <<<"$line" | head -1)"; bad=1
      fi
    done < <(grep -E "$SIBLINGS_RE|/work/" "$file" || true)
  done < <(git ls-files -z)
  return "$bad"
}

self_test() {
  local script tmp failures=0
  script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  make_repo() {
    rm -rf "$tmp/repo" && mkdir -p "$tmp/repo/crate/src" "$tmp/repo/crate/tests" "$tmp/repo/scripts"
    (cd "$tmp/repo" && git init -q . && printf '[package]\nname = "c"\n' > crate/Cargo.toml \
      && printf 'fn main() { let _ = &v[..]; for _ in 0..3 {} }\n' > crate/src/main.rs \
      && printf 'cd "$(dirname "$0")/.."\n' > scripts/run.sh \
      && printf 'const M: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/m.ir");\n' > crate/tests/ok.rs)
  }
  expect() { # expect PASS|FAIL description
    local want="$1" what="$2" got
    (cd "$tmp/repo" && git add -A >/dev/null)
    if (bash "$script" --root "$tmp/repo" >/dev/null 2>&1); then got=PASS; else got=FAIL; fi
    if [ "$got" = "$want" ]; then echo "check-paths self-test: $what: $got, as it should"
    else echo "check-paths self-test: $what: $got, expected $want" >&2; failures=$((failures + 1)); fi
  }
  make_repo; expect PASS "a clean repository (ranges, dirname/.., paths inside)"
  make_repo
  # The sibling folder's name, built so that this file never spells the paths it hunts.
  sib="shar""ed"
  printf 'const Q: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../'"$sib"'/models/q.ir");\n' > "$tmp/repo/crate/tests/bad.rs"
  expect FAIL "a test reading ../../$sib beside the clone"
  make_repo; printf 'See `../'"$sib"'/DESIGN.md`.\n' > "$tmp/repo/README.md"
  expect FAIL "a doc pointing at ../$sib"
  make_repo; printf 'The grammar of `'"$sib"'/ir-format.md`.\n' > "$tmp/repo/crate/src/lib.rs"
  expect FAIL "a doc comment naming $sib/ without ../"
  make_repo; printf 'cat /work/'"$sib"'/DESIGN.md\n' > "$tmp/repo/scripts/bad.sh"
  expect FAIL "an absolute path into /work/"
  make_repo; printf 'cat ../../x\n' > "$tmp/repo/scripts/bad.sh"
  expect FAIL "a script climbing two levels from scripts/"
  make_repo; printf 'See `../'"$sib"'/DESIGN.md` (check-paths: allow).\n' > "$tmp/repo/README.md"
  expect PASS "a line marked check-paths: allow"
  [ "$failures" -eq 0 ]
}

root=""
case "${1:-}" in
  --self-test) self_test; exit $? ;;
  --root) root="$2" ;;
  "") root="$(cd "$(dirname "$0")/.." && pwd)" ;;
  *) echo "usage: $0 [--self-test | --root DIR]" >&2; exit 2 ;;
esac
if check_repo "$root"; then
  echo "check-paths: no tracked file refers to a path outside the repository"
else
  echo "check-paths: the files above refer to paths outside the repository; a clone has none of them" >&2
  exit 1
fi
