"""The board's power at rest, for the static term of the power-cap law (meshplan.cost.calibration).

Opens a CUDA context, lets the GPU sit idle for ``--seconds`` and samples NVML's power reading and
SM clock every 100 ms; then ``nvidia-smi -q -d POWER,PERFORMANCE`` for the driver's own readings.
Run on the GPU machine: ``python3 benchmarks/gpu_idle_power.py --out idle.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_sweep import PowerSampler  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_idle_power: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    sampler = PowerSampler()
    with sampler:
        time.sleep(args.seconds)
    power = [s[1] for s in sampler.samples]
    clock = [s[2] for s in sampler.samples]
    smi = subprocess.run(["nvidia-smi", "-q", "-d", "POWER,PERFORMANCE,TEMPERATURE"], capture_output=True, text=True).stdout
    result = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "nvml": sampler.info(), "idle_power_w_median": statistics.median(power), "idle_power_w_min": min(power),
              "idle_power_w_max": max(power), "sm_mhz_median": statistics.median(clock), "samples": sampler.samples,
              "nvidia_smi": smi}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"idle power median {result['idle_power_w_median']:.1f} W (min {min(power):.1f}, max {max(power):.1f}), "
          f"SM clock {result['sm_mhz_median']:.0f} MHz over {len(power)} samples")
    print(smi)
    return 0


if __name__ == "__main__":
    sys.exit(main())
