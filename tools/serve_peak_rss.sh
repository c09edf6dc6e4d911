#!/bin/bash
# Peak RSS (VmHWM) of `edge-runtime serve --config cpu-dev` per --weights form, read from /proc after
# start-up and one 32-token chat request (polled until the model has loaded). Run from the
# repository root: tools/serve_peak_rss.sh [OUT_DIR]
out=${1:-/tmp}

for w in gguf fp32; do
  sock=$out/serve-$w.sock; rm -f $sock
  .venv/bin/edge-runtime serve --config cpu-dev --weights $w --socket $sock > $out/serve-$w.log 2>&1 &
  pid=$!
  for i in $(seq 1 300); do
    curl -s --unix-socket $sock http://x/v1/chat/completions -H 'content-type: application/json' \
      -d '{"messages":[{"role":"user","content":"Turn on the kitchen lights."}],"max_tokens":32}' > $out/serve-$w.out 2>/dev/null
    grep -q '"choices"' $out/serve-$w.out && break; sleep 1
  done
  echo "$w $(grep VmHWM /proc/$pid/status) $(grep VmRSS /proc/$pid/status)"
  kill -TERM $pid; wait $pid
done
