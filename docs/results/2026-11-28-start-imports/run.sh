#!/bin/bash
# alternating before/after `python -m measure start` runs on one store; the first (discarded) run keeps the choice
set -u
# BEFORE and AFTER: two checkouts (each with its .venv); STORE: the model store; OUT: where each run writes
STORE=${STORE:?}; BEFORE=${BEFORE:?}; AFTER=${AFTER:?}; OUT=${OUT:?}
run() {  # tree label engine port index
  local tree=$1 label=$2 engine=$3 port=$4 i=$5
  echo "=== $(date -u +%T) $engine $label $i load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd $tree && PYTHONPATH=$tree timeout 500 .venv/bin/python -m measure start --store $STORE --engine $engine \
     --port $port --runs 1 --warm --out $OUT/$engine-$label-$i) 2>&1 | tail -8
}
run $AFTER after torchserve 9300 0
run $AFTER after kserve 9310 0
for i in 1 2; do
  for engine in torchserve kserve; do
    port=$([ $engine = torchserve ] && echo 9300 || echo 9310)
    run $BEFORE before $engine $port $i
    run $AFTER after $engine $port $i
  done
done
echo "=== done $(date -u +%T)"
