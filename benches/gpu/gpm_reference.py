#!/usr/bin/env python3
"""An independent reading of the same GPU counters the exporter reads, for the real-GPU check.

It uses NVIDIA's own Python binding (nvidia-ml-py, `pynvml`), not gpuledger's code, so that the
exporter's /metrics can be compared with what NVML answers to another client over the same
seconds (benches/gpu/real_gpu_check.sh, BENCHMARKS.md "A real GPU"). Once a second, for every
GPU (no MIG: the check never changes MIG mode), it writes one CSV row: the Unix second, the GPU
index, GPM SM_UTIL, SM_OCCUPANCY, ANY_TENSOR_UTIL and DRAM_BW_UTIL as ratios (GPM gives
percent), framebuffer used bytes and power in watts. Usage: gpm_reference.py SECONDS OUT.csv
"""

import csv
import sys
import time

import pynvml as n

METRICS = [
    ("sm_active", n.NVML_GPM_METRIC_SM_UTIL),
    ("sm_occupancy", n.NVML_GPM_METRIC_SM_OCCUPANCY),
    ("tensor_active", n.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
    ("dram_active", n.NVML_GPM_METRIC_DRAM_BW_UTIL),
]


def gpm(handle, before, after):
    metrics = n.c_nvmlGpmMetricsGet_t()
    metrics.version = n.NVML_GPM_METRICS_GET_VERSION
    metrics.numMetrics = len(METRICS)
    metrics.sample1 = before
    metrics.sample2 = after
    for i, (_, metric_id) in enumerate(METRICS):
        metrics.metrics[i].metricId = metric_id
    n.nvmlGpmMetricsGet(metrics)
    return [metrics.metrics[i].value / 100.0 for i in range(len(METRICS))]


def main():
    seconds, out = int(sys.argv[1]), sys.argv[2]
    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    supported = [n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice for h in handles]
    print("gpm_reference: GPM supported per GPU:", supported, flush=True)
    samples = [n.nvmlGpmSampleAlloc() if s else None for s in supported]
    for h, s in zip(handles, samples):
        if s is not None:
            n.nvmlGpmSampleGet(h, s)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["ts", "gpu", *[m for m, _ in METRICS], "fb_used_bytes", "power_watts", "energy_mj"]
        )
        next_tick = int(time.time()) + 1
        for _ in range(seconds):
            time.sleep(max(0.0, next_tick - time.time()))
            for i, h in enumerate(handles):
                act = [""] * len(METRICS)
                if samples[i] is not None:
                    fresh = n.nvmlGpmSampleAlloc()
                    n.nvmlGpmSampleGet(h, fresh)
                    act = gpm(h, samples[i], fresh)
                    n.nvmlGpmSampleFree(samples[i])
                    samples[i] = fresh
                fb = n.nvmlDeviceGetMemoryInfo(h).used
                power = n.nvmlDeviceGetPowerUsage(h) / 1000.0
                # The total-energy counter (mJ since the driver loaded): the exporter's per-second
                # joules are its differences (energy_report.py compares them).
                energy = n.nvmlDeviceGetTotalEnergyConsumption(h)
                w.writerow([next_tick, i, *act, fb, power, energy])
            f.flush()
            next_tick += 1
    n.nvmlShutdown()


if __name__ == "__main__":
    main()
