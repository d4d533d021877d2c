#!/usr/bin/env bash
# One device call (#3): softmax_persist_probe.py on main's tree (abm/) and this one, two rounds interleaved.
#   bash experiments/scratch/softmax_persist_call.sh, carry [".kc", "abm"]
. experiments/scratch/_call_env.sh
for r in 1 2; do
  PYTHONPATH=abm timeout 60 python experiments/scratch/softmax_persist_probe.py tree_$r
  PYTHONPATH=. timeout 60 python experiments/scratch/softmax_persist_probe.py here_$r
done
pack
