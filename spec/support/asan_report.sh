#!/usr/bin/env bash
# make asan's verdict (the Makefile's asan target): the suite's exit status
# and the sanitizer reports its processes left in DIR, one file each
# (ASAN_OPTIONS/UBSAN_OPTIONS log_path=DIR/...:log_exe_name=1, so a file is
# named for its program and pid; LeakSanitizer's suppressions,
# spec/support/lsan.supp, are applied before anything is written).  The last
# line says PASS or FAIL; exit status 0 only on PASS.
#
# The rule: a report is lecho's when
#   - its process is lecho's code: luajit (busted, the lecho CLI, the
#     processes specs start), or a C program built from lecho's sources (the
#     base name, less a "-N" suffix that S.tmpname adds, of a .c file in
#     bench/, spec/support/, core/test/, core/fuzz/ or examples/c/: lecho_h,
#     capi_exit-17, test_codec, fuzz_conn, heat, ...); or
#   - a frame of its stacks is in lecho's code, in whatever program: a source
#     file under core/, bench/ or spec/support/, or a module lua/lecho/*.so
#     (or a rock's .../lecho/*.so) or liblecho.so (python3 with liblecho,
#     a tool started with lecho's library loaded).
# Every report of lecho's fails the run and is printed.  Any other report
# (the tools the specs start inherit LD_PRELOAD of libasan: cc, as, mktemp,
# sed, git, sort, zip, tail, gnuplot, python3's protocol peer, ...) is a leak
# of their own at exit, counted by program, not failed (their stacks often
# have no frame past malloc: a suppression cannot name them) -- except a
# memory error (AddressSanitizer) or a UBSan report, which fails whatever
# the program.
#
# Usage: spec/support/asan_report.sh DIR SUITE_STATUS
# (spec/asan_report_spec.lua runs it on spec/support/asan_fixture/.)
set -u
dir=$1 status=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# lecho's programs: luajit, and one per C source with a main of its own
declare -A ours=([luajit]=1)
shopt -s nullglob
for c in "$root"/bench/*.c "$root"/spec/support/*.c "$root"/core/test/*.c "$root"/core/fuzz/*.c \
         "$root"/examples/c/*.c; do
  c=${c##*/}; ours[${c%.c}]=1
done
ours_prog() {
  local e=$1
  [ -n "${ours[$e]:-}" ] && return 0
  [[ $e == luajit* ]] && return 0              # luajit-2.1.0-beta3 and the like
  e=${e%-[0-9]*}                              # capi_exit-17: spec/support/capi_exit.c
  [ -n "${ours[$e]:-}" ]
}
# a frame (#N 0x... in FN FILE:LINE, or #N 0x... (MODULE+0x...)) in lecho's code
ours_frame() {
  grep -q -E '^ *#[0-9]+ .*(( |/)(core|bench|spec/support)/[^ ]*:[0-9]+|/lecho/[A-Za-z0-9_]+\.so\+0x|liblecho\.so[.0-9]*\+0x)' "$1"
}

bad=() others=()
declare -A count=()
for f in "$dir"/asan.* "$dir"/ubsan.*; do
  # log_exe_name=1: PREFIX.EXE.PID (EXE: the base name of argv[0])
  base=${f##*/}; rest=${base#*.}; exe=${rest%.*}
  if ! ours_prog "$exe" && ! ours_frame "$f" && ! grep -q -E 'ERROR: AddressSanitizer|runtime error:' "$f" &&
     grep -q 'ERROR: LeakSanitizer' "$f"; then
    count[$exe]=$(( ${count[$exe]:-0} + 1 ))
    continue
  fi
  bad+=("$f")
done
for e in "${!count[@]}"; do others+=("$e ${count[$e]}"); done

for f in "${bad[@]}"; do
  echo "== sanitizer report $f:"
  head -n 80 "$f"
done
t=""
[ ${#others[@]} -eq 0 ] || t="; leak reports of other programs counted, not failed: $(printf '%s\n' "${others[@]}" | sort | paste -sd, | sed 's/,/, /g')"
if [ "$status" -eq 0 ] && [ ${#bad[@]} -eq 0 ]; then
  echo "make asan: PASS: the suite passed, no sanitizer report from lecho's processes or code (reports in $dir)$t"
  exit 0
fi
echo "make asan: FAIL: suite exit status $status, ${#bad[@]} sanitizer report(s) from lecho's processes or code (printed above; $dir)$t"
exit 1
