#!/usr/bin/env bash
# Runs benchmarks/gpu_scale.sh steps in a process session of their own, so one device call can start a queue
# that outlives it and later calls only wait for it: no idle machine between steps, and each call returns
# within the tool's 10-minute limit.
#   setsid nohup bash benchmarks/gpu_queue.sh run STEP... >/dev/null 2>&1 &   (returns at once)
#   bash benchmarks/gpu_queue.sh wait SECONDS     (until the queue ends or SECONDS pass; its logs to $OUT/queue.tgz)
#   bash benchmarks/gpu_queue.sh stop             (ends the queue and everything it started)
Q=/tmp/gpu-queue
case $1 in
  run)  shift; mkdir -p $Q/out; echo $$ > $Q/pid; echo running > $Q/state
        OUT=$Q/out bash benchmarks/gpu_scale.sh "$@" > $Q/console.log 2>&1; echo done > $Q/state ;;
  wait) end=$((SECONDS + $2))
        while [ $SECONDS -lt $end ] && [ "$(cat $Q/state 2>/dev/null)" = running ]; do sleep 5; done
        echo "queue: $(cat $Q/state 2>/dev/null)"; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
        tar -czf "$OUT/queue.tgz" -C $Q out console.log 2>/dev/null; tail -c 9000 $Q/console.log ;;
  stop) kill -- -"$(cat $Q/pid)" 2>/dev/null; pkill -9 -f "megarl|raylet|gcs_server|ray::|pytest"; echo stopped > $Q/state ;;
esac
