#!/bin/bash
# rss.sh PID OUT: every 5 s, the RSS (MB) of PID and its descendants, until PID exits
pid=$1; out=$2
while kill -0 $pid 2>/dev/null; do
  t=$(date +%s); tot=0
  for p in $pid $(pgrep -P $pid) $(for c in $(pgrep -P $pid); do pgrep -P $c; done); do
    r=$(awk '/VmRSS/{print $2}' /proc/$p/status 2>/dev/null); tot=$((tot + ${r:-0}))
  done
  echo "$t $((tot/1024))" >> $out; sleep ${3:-5}
done
