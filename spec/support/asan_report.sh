#!/usr/bin/env bash
# make asan's verdict (the Makefile's asan target): the suite's exit status
# and the sanitizer reports its processes left in DIR, one file each
# (ASAN_OPTIONS/UBSAN_OPTIONS log_path=DIR/...:log_exe_name=1, so a file is
# named for its program and pid; LeakSanitizer's suppressions,
# spec/support/lsan.supp, are applied before anything is written).  Every
# report of lecho's own processes (luajit: busted and the processes specs
# start; the C tests and C programs; anything not listed below) fails the run
# and is printed.  The last line says PASS or FAIL; exit status 0 only on
# PASS.
#
# Usage: spec/support/asan_report.sh DIR SUITE_STATUS
set -u
dir=$1 status=$2

# Programs the specs start that are not lecho's: they inherit LD_PRELOAD
# (libasan) from the spec's environment, and LeakSanitizer reports what they
# leave allocated at exit.  Their leak reports are counted, not failed (their
# stacks often have no frame past malloc: a suppression cannot name them);
# a memory error in one would still fail the run.  One line of why each:
tool() {
  case "$1" in
    mktemp|cp|install|rm|date) return 0 ;;  # coreutils (spec temp dirs, make install): free nothing before exit
    sed|sort|tail) return 0 ;;         # text tools of the specs' and the bench's shell pipelines: the same
    git) return 0 ;;                   # docs_spec (git ls-files, check-ignore) and the bench's commit: its caches kept to exit
    zip) return 0 ;;                   # luarocks' pack in the rockspec and install specs
    gnuplot) return 0 ;;               # the bench's charts (bench/report.lua)
    ip) return 0 ;;                    # iproute2 (the network namespace specs): its netlink caches kept to exit
    cc|gcc|gcc-*|cc1|collect2|lto-wrapper|as|ld|ld.bfd|x86_64-linux-gnu-*) return 0 ;;
                                       # gcc, as, ld (specs that build C: examples, relays, make install): xmalloc'd tables kept to exit
    python3*) return 0 ;;              # spec/python's protocol peer, standard library only (no liblecho in make asan): CPython frees not all at exit
  esac
  return 1
}

bad=() tools=()
declare -A toolcount=()
shopt -s nullglob
for f in "$dir"/asan.* "$dir"/ubsan.*; do
  # log_exe_name=1: PREFIX.EXE.PID (EXE: the base name of argv[0])
  base=${f##*/}; rest=${base#*.}; exe=${rest%.*}
  if tool "$exe" && ! grep -q -E 'ERROR: AddressSanitizer|runtime error:' "$f" &&
     grep -q 'ERROR: LeakSanitizer' "$f"; then
    toolcount[$exe]=$(( ${toolcount[$exe]:-0} + 1 ))
    continue
  fi
  bad+=("$f")
done
for e in "${!toolcount[@]}"; do tools+=("$e ${toolcount[$e]}"); done

for f in "${bad[@]}"; do
  echo "== sanitizer report $f:"
  head -n 80 "$f"
done
t=""
[ ${#tools[@]} -eq 0 ] || t="; leak reports of other programs counted, not failed: $(printf '%s\n' "${tools[@]}" | sort | paste -sd, | sed 's/,/, /g')"
if [ "$status" -eq 0 ] && [ ${#bad[@]} -eq 0 ]; then
  echo "make asan: PASS: the suite passed, no sanitizer report from lecho's processes (reports in $dir)$t"
  exit 0
fi
echo "make asan: FAIL: suite exit status $status, ${#bad[@]} sanitizer report(s) from lecho's processes (printed above; $dir)$t"
exit 1
