#!/usr/bin/env bash
# Runs benchmarks/gpu_scale.sh steps in a process session of their own, so one device call can start a queue
# that outlives it and later calls only wait for it: no idle machine between steps, and each call returns
# within the tool's 10-minute limit.
#   setsid nohup bash benchmarks/gpu_queue.sh run ITEM... >/dev/null 2>&1 &   (returns at once)
#   bash benchmarks/gpu_queue.sh wait SECONDS     (until the queue ends or SECONDS pass; its logs to $OUT/queue.tgz)
#   bash benchmarks/gpu_queue.sh stop             (ends the queue and everything it started)
#   setsid nohup bash benchmarks/gpu_queue.sh after ITEM... >/dev/null 2>&1 &   (runs ITEMs once the running queue
#                                                 ends, as `run`: more work for a queue already started)
# An ITEM is a step, run on every GPU after the steps before it; GPUS:STEP,STEP... (e.g. 0,1:model7b,e2e7b_tp2)
# starts those steps in order on those GPUs beside the items that follow; `join` waits for every such group.
# Change scripts here, never on the device: every device call copies the working tree again, which reverts them.
Q=/tmp/gpu-queue
case $1 in
  run)  shift; mkdir -p $Q/out; echo $$ > $Q/pid; echo running > $Q/state
        for item in "$@"; do
          case $item in
            join) wait ;;
            *:*)  gpus=${item%%:*}; IFS=, read -ra steps <<< "${item#*:}"
                  CUDA_VISIBLE_DEVICES=$gpus OUT=$Q/out bash benchmarks/gpu_scale.sh "${steps[@]}" \
                    >> "$Q/console.gpus$gpus.log" 2>&1 & ;;  # >>: a later group on these GPUs appends
            *)    OUT=$Q/out bash benchmarks/gpu_scale.sh "$item" >> $Q/console.log 2>&1 ;;
          esac
        done
        wait; echo done > $Q/state ;;
  wait) end=$((SECONDS + $2))
        while [ $SECONDS -lt $end ] && [ "$(cat $Q/state 2>/dev/null)" = running ]; do sleep 5; done
        echo "queue: $(cat $Q/state 2>/dev/null)"; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
        tar -czf "$OUT/queue.tgz" -C $Q out $(cd $Q && ls console*.log) 2>/dev/null
        for log in $Q/console*.log; do echo "--- $(basename "$log")"; tail -c 4000 "$log"; done ;;
  after) shift; while [ "$(cat $Q/state 2>/dev/null)" = running ]; do sleep 2; done; exec bash "$0" run "$@" ;;
  stop) kill -- -"$(cat $Q/pid)" 2>/dev/null; pkill -9 -f "megarl|raylet|gcs_server|ray::|pytest"; echo stopped > $Q/state ;;
esac
