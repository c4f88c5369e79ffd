#!/usr/bin/env bash
# scripts/gpu-check.sh on a machine without a GPU: (1) without nvidia-smi it reports "no device"
# as one JSON line and exits 77, running nothing; (2) with a fake nvidia-smi that lists a GPU, the
# device path runs against this (CPU) build and must fail: its gpu-labelled test skips, which on a
# GPU machine is a failure, there is no device kernel test to run under compute-sanitizer, and the
# kernels bench skips its device case. The JSON line must say so.
# Usage: gpu_check_test.sh <repo root> <build dir>
set -uo pipefail
root=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "gpu_check_test: $*" >&2; exit 1; }

# (1) No nvidia-smi on the PATH (only the directories of bash and the coreutils).
out=$(env PATH=/usr/bin:/bin bash -c "command -v nvidia-smi >/dev/null && exit 99; '$root/scripts/gpu-check.sh' '$build'")
rc=$?
[ "$rc" -eq 99 ] && { echo "gpu_check_test: nvidia-smi in /usr/bin: a GPU machine, not this test's case"; exit 77; }
[ "$rc" -eq 77 ] || fail "no device: exit $rc, expected 77 ($out)"
/usr/bin/python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["gpu_check"]=="no device", d' "$out" ||
  fail "no device: not the JSON line expected: $out"

# (2) A fake nvidia-smi that lists one GPU.
mkdir -p "$tmp/bin"
cat >"$tmp/bin/nvidia-smi" <<'SMI'
#!/bin/sh
case "$*" in
  -L) echo "GPU 0: Fake H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *memory.used*) echo 1234 ;;
  *name,driver_version,memory.total*) echo "Fake H200, 999.99, 143771" ;;
  *) exit 1 ;;
esac
SMI
chmod +x "$tmp/bin/nvidia-smi"
out=$(PATH="$tmp/bin:$PATH" "$root/scripts/gpu-check.sh" "$build" 2>"$tmp/stderr")
rc=$?
[ "$rc" -eq 1 ] || { cat "$tmp/stderr" >&2; fail "fake device: exit $rc, expected 1 ($out)"; }
/usr/bin/python3 - "$out" <<'PY' || fail "fake device: not the JSON line expected: $out"
import json, sys
d = json.loads(sys.argv[1].strip().splitlines()[-1])
assert d["gpu_check"] == "failed", d
assert d["gpu"] == "Fake H200" and d["driver"] == "999.99" and d["memory_total_mib"] == 143771, d
assert d["checks"]["ctest_gpu"] == "failed", d            # a skipped gpu test fails on a device
assert "test_workers_gpu" in d["skipped_on_device"], d
assert d["checks"]["worker_rollout_sampling"] == "failed", d  # skipped on a device is a failure
assert d["checks"]["adapter_side_stream"] == "missing", d     # built only against a CUDA LibTorch
assert d["checks"]["memcheck"] == "missing" and d["checks"]["racecheck"] == "missing", d  # no CUDA build
if d["checks"]["kernels_bench"] != "missing":         # built unless -DHYFLOW_BUILD_BENCH=OFF
    assert d["checks"]["kernels_bench"] == "failed", d   # the CPU build's bench skips its device case
    assert any("skipped" in line for line in d["bench"]), d
assert d["peak_memory_used_mib"] == 1234, d
PY
echo "gpu_check_test: no device -> 77; a fake device on a CPU build -> failed, as it must"
