#!/usr/bin/env bash
# Run the toy workflow once on the local cluster and record the outcome.
#   tests/slurm/run_toy.sh LABEL [extra snakemake args...] [-- target]
# Writes ${CIRCUITFLOW_SLURM_RUNS:-/tmp/circuitflow-slurm-runs}/LABEL/{snakemake.log,sacct.txt,result.txt}
# and prints one summary line: LABEL rc=.. wall=..s outputs=ok|MISSING.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
eval "$("$here/cluster.sh" env)"
label="$1"; shift
target=()
args=()
while [[ $# -gt 0 ]]; do
  if [[ "$1" == -- ]]; then shift; target=("$@"); break; fi
  args+=("$1"); shift
done
out="${CIRCUITFLOW_SLURM_RUNS:-/tmp/circuitflow-slurm-runs}/$label"
work="$out/work"          # fresh working copy per run: no leftovers between runs
rm -rf "$out"; mkdir -p "$work"
cp "$here/toy/Snakefile" "$work/"
start_ts="$(date +%Y-%m-%dT%H:%M:%S)"
t0=$(date +%s.%N)
( cd "$work" && snakemake --profile "$here/toy/profile" --slurm-keep-successful-logs \
    "${target[@]}" "${args[@]}" ) >"$out/snakemake.log" 2>&1
rc=$?
wall=$(awk "BEGIN {printf \"%.0f\", $(date +%s.%N) - $t0}")
# Everything Slurm ran during this run (array tasks show as JOBID_N).
sacct -S "$start_ts" -o JobID%14,JobIDRaw,JobName%12,Partition,Account%16,State,ExitCode,Elapsed,Start,End >"$out/sacct.txt" 2>&1
ok=ok; for f in results/summary.txt; do [[ -s "$work/$f" ]] || ok=MISSING; done
[[ ${#target[@]} -gt 0 ]] && ok="target=${target[*]}"
errs=$(grep -cE "MissingOutputException|Error in rule|WorkflowError|failed" "$out/snakemake.log")
echo "$label rc=$rc wall=${wall}s outputs=$ok error_lines=$errs args='${args[*]}'" | tee "$out/result.txt"
