"""Agreement of rollout's admission model with the kubelet's own code, and the cost of each.

Usage: .venv/bin/python benchmarks/admission_agreement.py [N] [HARNESS]

Generates N seeded scenarios (default 10,000; seeds 0..N-1, as tests/unit/test_admission_diff.py),
runs them through the Go harness compiled from the kubelet's packages (tools/admissiondiff; built
by tools/build-admission-harness.sh when HARNESS is not given) in one process, and through the
Python model; prints scenario and pod counts, the agreement rate, outcome counts, wall times.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from rollout.kubelet.admission import diff, scenarios

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    if len(sys.argv) > 2:
        harness = sys.argv[2]
    else:
        out = subprocess.run(
            [str(ROOT / "tools" / "build-admission-harness.sh")],
            check=True,
            capture_output=True,
            text=True,
        )
        harness = out.stdout.strip().splitlines()[-1]
    t = time.perf_counter()
    cases = [scenarios.generate(seed) for seed in range(n)]
    t_gen = time.perf_counter() - t
    t = time.perf_counter()
    kubelet = diff.run_harness(harness, cases)
    t_go = time.perf_counter() - t
    t = time.perf_counter()
    model = [diff.run_model(sc) for sc in cases]
    t_py = time.perf_counter() - t
    agree = sum(1 for m, k in zip(model, kubelet, strict=True) if not diff.compare(m, k))
    pods = sum(len(k.get("pods") or []) for k in kubelet)
    outcomes = Counter(p.get("reason") or "admitted" for k in kubelet for p in k.get("pods") or [])
    print(f"scenarios {n}, pods {pods}")
    print(f"agreeing scenarios {agree} / {n} = {agree / n:.4%}")
    print(f"kubelet outcomes {dict(outcomes)}")
    print(f"generate {t_gen:.1f}s, kubelet harness {t_go:.1f}s, model {t_py:.1f}s")


if __name__ == "__main__":
    main()
