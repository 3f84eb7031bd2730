#!/usr/bin/env bash
# `make spec` with no spec file named: every spec/*_spec.lua in its own busted
# process, JOBS of them at a time (most of a spec's time is waiting: timers,
# other processes), longest first by the seconds measured below, then the
# SERIAL files one by one with nothing beside them.  Each file's output is
# printed whole when it ends, under a line with its time and status; the last
# line is the total in busted's own words ("N successes / N failures / N
# errors / N pending"), which .ci/run restates.  A file whose busted ends with
# no summary line (a crash, a signal) or fails with none counted counts as
# one error: it never vanishes from the total.  Exit status: 0 only when
# nothing failed.
#
# Usage: spec/support/shards.sh JOBS COMMAND ... (busted and its options:
# each run appends its files), from the tree's root with SPEC_ENV's
# variables set: the Makefile's spec target.
set -u
jobs=$1; shift
cmd=("$@")

# Files that must not share the machine: busy_host_spec loads every core on
# purpose; bench_spec runs `make bench QUICK=1` (which times things);
# gateway_soak_spec keeps two busy loops for its 25 s soak.
SERIAL=" spec/busy_host_spec.lua spec/bench_spec.lua spec/gateway_soak_spec.lua "

# Files run one after another in one busted (one job slot): the ones that
# run `make install`, which writes build/inst/ (liblecho.so.0, lecho.pc).
CHAINS=("spec/install_spec.lua spec/c_example_spec.lua spec/scripts_spec.lua spec/rockspec_spec.lua")

# Seconds each file took alone (make spec BUSTED_ARGS=..., one after
# another, on the 2-core machine with other work beside, load 3-10): only
# the order depends on them.  A file not listed (or under 2 s) counts as
# DEFAULT.
DEFAULT=3
weight() {
  case "$1" in
    spec/gateway_soak_spec.lua) echo 35 ;;
    spec/trust_members_spec.lua) echo 54 ;;
    spec/stress_spec.lua) echo 51 ;;
    spec/trust_nameserver_spec.lua) echo 38 ;;
    spec/bench_spec.lua) echo 38 ;;
    spec/presence_spec.lua) echo 35 ;;
    spec/limits_conn_spec.lua) echo 34 ;;
    spec/nameserver_restart_spec.lua) echo 31 ;;
    spec/trust_peers_spec.lua) echo 30 ;;
    spec/keiretsu_spec.lua) echo 29 ;;
    spec/delivery_spec.lua) echo 25 ;;
    spec/rockspec_spec.lua) echo 24 ;;
    spec/repl_spec.lua) echo 22 ;;
    spec/push_spec.lua) echo 19 ;;
    spec/busy_host_spec.lua) echo 19 ;;
    spec/calls_hardening_spec.lua) echo 18 ;;
    spec/service_spec.lua) echo 18 ;;
    spec/install_spec.lua) echo 8 ;;
    spec/trust_limits_spec.lua) echo 16 ;;
    spec/modulator_spec.lua) echo 16 ;;
    spec/scripts_spec.lua) echo 14 ;;
    spec/netns_spec.lua) echo 10 ;;
    spec/moe_containment_spec.lua) echo 10 ;;
    spec/liveness_spec.lua) echo 9 ;;
    spec/badinput_spec.lua) echo 9 ;;
    spec/replicas_spec.lua) echo 8 ;;
    spec/lpat_diff_spec.lua) echo 8 ;;
    spec/limits_peers_spec.lua) echo 8 ;;
    spec/limits_state_spec.lua) echo 8 ;;
    spec/ordering_spec.lua) echo 6 ;;
    spec/policy_spec.lua) echo 6 ;;
    spec/limits_decode_spec.lua) echo 6 ;;
    spec/atmosphere_spec.lua) echo 5 ;;
    spec/keys_spec.lua) echo 5 ;;
    spec/moe_fixes_spec.lua) echo 5 ;;
    spec/sync_spec.lua) echo 5 ;;
    spec/nameserver_quota_spec.lua) echo 4 ;;
    spec/channel_lookup_spec.lua) echo 4 ;;
    spec/call_batch_spec.lua) echo 4 ;;
    spec/members_authority_spec.lua) echo 3 ;;
    spec/fastenc_spec.lua) echo 3 ;;
    spec/sandbox_spec.lua) echo 3 ;;
    spec/c_example_spec.lua) echo 3 ;;
    spec/addr_transports_spec.lua) echo 2 ;;
    spec/limits_list_spec.lua) echo 2 ;;
    spec/modulator_sync_spec.lua) echo 2 ;;
    spec/manager_spec.lua) echo 2 ;;
    spec/authz_keyed_spec.lua) echo 2 ;;
    *) echo "$DEFAULT" ;;
  esac
}

tmp=$(mktemp -d /tmp/lecho-spec-shards.XXXXXX) || exit 1
declare -A pid_unit=() started=()
trap 'for p in "${!pid_unit[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"; exit 130' INT TERM

# The units: a file alone, or a chain; each with the sum of its weights.
chained=" ${CHAINS[*]} "
units=() serial=()
for c in "${CHAINS[@]}"; do
  u=""; for f in $c; do [ -e "$f" ] && u="$u $f"; done
  [ -z "$u" ] || units+=("${u# }")
done
for f in spec/*_spec.lua; do
  if [[ $SERIAL == *" $f "* ]]; then serial+=("$f")
  elif [[ $chained != *" $f "* ]]; then units+=("$f"); fi
done
unit_weight() { local w=0 f; for f in $1; do w=$((w + $(weight "$f"))); done; echo "$w"; }
# longest first
mapfile -t units < <(for u in "${units[@]}"; do echo "$(unit_weight "$u") $u"; done | sort -k1,1nr -k2 | cut -d' ' -f2-)

total_s=0 total_f=0 total_e=0 total_p=0 ran=0 bad=()
now() { date +%s.%N; }
t0=$(now)
logof() { echo "$tmp/$(basename "${1%% *}" .lua).log"; }

start() {  # start one unit's busted in the background
  # shellcheck disable=SC2086 # a unit is a list of file names
  "${cmd[@]}" $1 >"$(logof "$1")" 2>&1 &
  pid_unit[$!]=$1
  started[$1]=$(now)
}

finish() {  # unit $1 ended with status $2: print its output, count it
  local u=$1 rc=$2 log line s=0 fl=0 e=0 p=0 secs
  log=$(logof "$u")
  secs=$(echo "$(now) - ${started[$u]}" | bc)
  line=$(grep -E '^[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors? / [0-9]+ pending' "$log" | tail -n 1)
  if [ -n "$line" ]; then
    read -r s fl e p < <(echo "$line" | sed -E 's#^([0-9]+) [a-z]+ / ([0-9]+) [a-z]+ / ([0-9]+) [a-z]+ / ([0-9]+) .*#\1 \2 \3 \4#')
  fi
  printf '== %s: %.1f s, status %s\n' "$u" "$secs" "$rc"
  cat "$log"
  if [ -z "$line" ] || { [ "$rc" -ne 0 ] && [ $((fl + e)) -eq 0 ]; }; then
    echo "== $u: busted ended with status $rc and $([ -z "$line" ] && echo "no summary" || echo "nothing failed"): counted as 1 error"
    e=$((e + 1))
  fi
  [ $((fl + e)) -eq 0 ] || bad+=("$u")
  total_s=$((total_s + s)) total_f=$((total_f + fl)) total_e=$((total_e + e)) total_p=$((total_p + p))
  ran=$((ran + 1))
}

next=0
while [ $next -lt ${#units[@]} ] || [ ${#pid_unit[@]} -gt 0 ]; do
  while [ $next -lt ${#units[@]} ] && [ ${#pid_unit[@]} -lt "$jobs" ]; do
    start "${units[$next]}"; next=$((next + 1))
  done
  wait -n -p done_pid "${!pid_unit[@]}"; rc=$?
  u=${pid_unit[$done_pid]}; unset "pid_unit[$done_pid]"
  finish "$u" "$rc"
done
for f in "${serial[@]}"; do
  start "$f"
  wait -n -p done_pid "${!pid_unit[@]}"; rc=$?
  unset "pid_unit[$done_pid]"
  finish "$f" "$rc"
done
rm -rf "$tmp"

secs=$(echo "$(now) - $t0" | bc)
[ ${#bad[@]} -eq 0 ] || echo "== failed: ${bad[*]}"
echo "== ${ran} busted runs (${#units[@]} at most ${jobs} at a time, then ${#serial[@]} alone), $(printf '%.1f' "$secs") s"
printf '%d successes / %d failures / %d errors / %d pending : %.1f seconds\n' \
  "$total_s" "$total_f" "$total_e" "$total_p" "$secs"
[ $((total_f + total_e)) -eq 0 ]
