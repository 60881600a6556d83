#!/usr/bin/env bash
# Writes the GPT-175B recipe of Korthikanti's table (tp8 pp8 v3, SP + selective) to $1; $2 = source dir.
out=$1; src=$2
{
cat <<R
[recipe]
version = 1
name = "gpt175b"
model = "$src/tests/data/models/gpt-175b-skeleton.onnx"
cluster = "dgx-a100"
nodes = 8

[model]
dims = { batch = 1, seq = 2048 }

[parallel]
dp = 1
tp = 8
pp = 8
micro_batch_size = 1
micro_batches = 64
schedule = "interleaved"
virtual_stages = 3
sequence_parallel = true
R
for j in $(seq 0 23); do
  printf '\n[[stages]]\nindex = %d\nlayers = "%d-%d"\nrecompute = "selective"\n' "$j" $((4*j)) $((4*j+3))
done
} > "$out"
