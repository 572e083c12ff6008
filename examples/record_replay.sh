#!/usr/bin/env bash
# Records examples/record_trace to TRACE, replays TRACE with gmlake-replay, and
# checks that the replay sees the same peak live bytes as the recording.
#   bash examples/record_replay.sh RECORD_TRACE_EXE GMLAKE_REPLAY_EXE TRACE
set -uo pipefail
record=${1:?usage: record_replay.sh RECORD_TRACE_EXE GMLAKE_REPLAY_EXE TRACE} replay=${2:?} trace=${3:?}
rm -f "$trace"
out=$("$record" "$trace") || { echo "$out"; echo "record_trace failed"; echo "0 passed, 1 failed"; exit 1; }
echo "$out"
recorded=$(sed -n 's/^peak live bytes (as gmlake-replay counts them): \([0-9]*\)$/\1/p' <<<"$out")
json=$("$replay" --json --config gmlake --config bfc "$trace") || { echo "gmlake-replay failed"; echo "0 passed, 1 failed"; exit 1; }
echo "$json"
replayed=$(sed -n 's/.*"allocator":"gmlake".*"peak_live_bytes":\([0-9]*\),.*/\1/p' <<<"$json")
echo "peak live bytes: recorded ${recorded:-?}, replayed ${replayed:-?}"
if [[ -n $recorded && $recorded == "$replayed" && $recorded -gt 0 ]]; then echo "1 passed, 0 failed"
else echo "0 passed, 1 failed"; exit 1; fi
