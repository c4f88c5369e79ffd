#!/usr/bin/env bash
# The device check of a GPU machine (docs/gpu.md, "The device check"), about 10 minutes on one
# H100/H200 once the build exists:
#   1. the environment: GPU, driver, CUDA toolkit, the build's LibTorch;
#   2. every CTest test labelled "gpu" (kernels, the tensor adapter with per-row device arrays on a
#      side stream at vocab 151,936 in bf16, NCCL, a worker on cuda:0 generating greedy and
#      sampled); on a GPU machine a test that reports "skipped" is a failure;
#   3. the device kernel test again under compute-sanitizer memcheck and racecheck;
#   4. the kernels bench (bench/cuda/cuda_kernels_bench), its JSON lines kept as figures (a device
#      case it skips is a failure);
#   5. the peak device memory in use while the worker test runs (nvidia-smi, sampled every 0.2 s).
# It prints one JSON line of figures and verdicts last.
#
# Usage: scripts/gpu-check.sh [build-dir]   (default: build-gpu, what .gpu-debs/device-build.sh
#        configures; when it is missing and .gpu-debs/ is here, the script builds it first)
# Exit codes: 0 every check passed; 1 a check failed (the JSON line says which); 2 no build and
# nothing to build it with; 77 no device (no nvidia-smi, or it lists no GPU): nothing was run.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
start=$(date +%s)
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

gpus=0
if command -v nvidia-smi >/dev/null; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true); fi
if [ "$gpus" -eq 0 ]; then
  printf '{"gpu_check":"no device","reason":"%s","exit_code":77}\n' \
    "$(command -v nvidia-smi >/dev/null && echo 'nvidia-smi lists no GPU' || echo 'no nvidia-smi on the PATH')"
  exit 77
fi

if [ ! -f "$build/CMakeCache.txt" ]; then
  if [ -f .gpu-debs/device-build.sh ]; then
    echo "gpu-check: building $build with .gpu-debs/device-build.sh" >&2
    bash .gpu-debs/device-build.sh >&2 || { echo "gpu-check: the build failed" >&2; exit 1; }
  else
    echo "gpu-check: no $build/ and no .gpu-debs/ to build it (docs/gpu.md)" >&2
    exit 2
  fi
fi
[ -d /opt/hyflow-deps/usr/lib/x86_64-linux-gnu ] &&
  export LD_LIBRARY_PATH="/opt/hyflow-deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

work=$(mktemp -d)
trap 'kill "${sampler:-}" 2>/dev/null; rm -rf "$work"' EXIT

# 1. Environment.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader,nounits | head -1 >"$work/gpu"
nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -1 >"$work/nvcc"
sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt" >"$work/torch_dir"

# 2. The gpu-labelled tests, with device memory sampled during them.
(
  while :; do
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1
    sleep 0.2
  done
) >"$work/memory" &
sampler=$!
timeout 420 ctest --test-dir "$build" -L gpu --output-on-failure >"$work/ctest.log" 2>&1
ctest_rc=$?
kill "$sampler" 2>/dev/null
sampler=
cat "$work/ctest.log" >&2

# 3. compute-sanitizer on the device kernel test.
kernel_test=$(find "$build/tests/cuda" -maxdepth 1 -name test_cuda_kernels_device -type f | head -1)
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
memcheck=missing racecheck=missing
if [ -n "$kernel_test" ] && [ -x "$sanitizer" ]; then
  for tool in memcheck racecheck; do
    if timeout 240 "$sanitizer" --tool "$tool" --error-exitcode 3 "$kernel_test" >"$work/$tool.log" 2>&1; then
      printf -v "$tool" passed
    else
      printf -v "$tool" failed
      tail -40 "$work/$tool.log" >&2
    fi
  done
fi

# 4. The kernels bench.
bench=$(find "$build/bench/cuda" -maxdepth 1 -name cuda_kernels_bench -type f 2>/dev/null | head -1)
bench_rc=missing
if [ -n "$bench" ]; then
  if timeout 180 "$bench" >"$work/bench.jsonl" 2>"$work/bench.err"; then bench_rc=passed; else bench_rc=failed; fi
fi

python3 - "$work" "$ctest_rc" "$memcheck" "$racecheck" "$bench_rc" "$(($(date +%s) - start))" <<'PY'
import json, pathlib, re, sys
work = pathlib.Path(sys.argv[1])
ctest_rc, memcheck, racecheck, bench_rc, wall = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
log = (work / "ctest.log").read_text(errors="replace")
tests = {m.group(1): m.group(2).strip() for m in re.finditer(r"Test +#\d+: (\S+) \.+\**\s*([A-Za-z ()]+?)\s+[\d.]+ sec", log)}
skipped = [name for name, verdict in tests.items() if "Skipped" in verdict or "Not Run" in verdict]
gpu = (work / "gpu").read_text().strip().split(", ")
memory = [int(x) for x in (work / "memory").read_text().split() if x.isdigit()]
bench = []
if (work / "bench.jsonl").exists():
    for line in (work / "bench.jsonl").read_text().splitlines():
        try:
            bench.append(json.loads(line))
        except json.JSONDecodeError:
            pass
if bench_rc == "passed" and any("skipped" in line for line in bench):
    bench_rc = "failed"  # on a GPU machine the bench's device cases must run
def verdict(test):  # one gpu test's own line: missing when this build has no such test
    if test not in tests:
        return "missing"
    return "passed" if tests[test] == "Passed" else "failed"
checks = {
    "ctest_gpu": "passed" if ctest_rc == "0" and tests and not skipped else "failed",
    # the adapter with per-row device arrays on a side stream, vocab 151,936, bf16
    "adapter_side_stream": verdict("test_cuda_adapter_device"),
    # test_workers_gpu: greedy and sampled rollouts, log-probs and an update on cuda:0 against the CPU
    "worker_rollout_sampling": verdict("test_workers_gpu"),
    "memcheck": memcheck,
    "racecheck": racecheck,
    "kernels_bench": bench_rc,
}
ok = all(v == "passed" for v in checks.values())
print(json.dumps({
    "gpu_check": "passed" if ok else "failed",
    "gpu": gpu[0] if gpu else None,
    "driver": gpu[1] if len(gpu) > 1 else None,
    "memory_total_mib": int(gpu[2]) if len(gpu) > 2 and gpu[2].isdigit() else None,
    "nvcc": (work / "nvcc").read_text().strip() or None,
    "torch_dir": (work / "torch_dir").read_text().strip() or None,
    "checks": checks,
    "tests": tests,
    "skipped_on_device": skipped,
    "peak_memory_used_mib": max(memory) if memory else None,
    # the device's HBM roofline as the kernels bench read it (cudaDevAttrMemoryClockRate x bus width)
    "hbm_roofline_gb_s": next((b.get("hbm_gb_s") for b in bench if b.get("bench") == "cuda_kernels_roofline"), None),
    "bench": bench,
    "wall_s": wall,
}))
sys.exit(0 if ok else 1)
PY
