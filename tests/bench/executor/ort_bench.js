// ONNX Runtime peer of bench_executor: times InferenceSession.run on the same model and input.
//
//   node ort_bench.js MODEL.onnx INPUT.{i64,f32} THREADS WARMUP ITERS DIM...
//
// INPUT is the model's one input as raw little-endian data, int64 ids (.i64, the GPT-style model)
// or float32 (.f32, the CNN's images), of the given dims.
// onnxruntime-node is looked up through NODE_PATH (run.sh installs it into a cache dir with
// `npm install --ignore-scripts onnxruntime-node`); it is a benchmark peer only, never an hp dependency.
// Sequential execution, intra-op threads = THREADS, inter-op 1, all graph optimisations (ORT's
// default). Prints one line: "ort threads=N median_ms=X min_ms=Y cpu_ms=Z iters=K" (cpu_ms: median
// process CPU time per run, all threads, as bench_executor measures it).
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

async function main() {
  const [model, inputPath, threads, warmupArg, itersArg, ...dimArgs] = process.argv.slice(2);
  if (!dimArgs.length) {
    console.error('usage: node ort_bench.js MODEL.onnx INPUT.{i64,f32} THREADS WARMUP ITERS DIM...');
    process.exit(2);
  }
  const warmup = Number(warmupArg), iters = Number(itersArg), dims = dimArgs.map(Number);
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: Number(threads),
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  });
  const buf = fs.readFileSync(inputPath);
  const f32 = inputPath.endsWith('.f32');
  const data = f32 ? new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4)
                   : new BigInt64Array(buf.buffer, buf.byteOffset, buf.length / 8);
  const feeds = { [session.inputNames[0]]: new ort.Tensor(f32 ? 'float32' : 'int64', data, dims) };
  for (let i = 0; i < warmup; ++i) await session.run(feeds);
  const ms = [], cpu = [];
  for (let i = 0; i < iters; ++i) {
    const t0 = process.hrtime.bigint();
    const c0 = process.cpuUsage();
    await session.run(feeds);
    const c = process.cpuUsage(c0);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    cpu.push((c.user + c.system) / 1e3);
  }
  const median = (v) => {
    v = [...v].sort((a, b) => a - b);
    return v.length % 2 ? v[(v.length - 1) / 2] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2;
  };
  console.log(`ort threads=${threads} median_ms=${median(ms).toFixed(2)} min_ms=${Math.min(...ms).toFixed(2)} ` +
              `cpu_ms=${median(cpu).toFixed(2)} iters=${iters}`);
}

main().catch((e) => {
  console.error(`ort_bench: ${e.message || e}`);
  process.exit(1);
});
