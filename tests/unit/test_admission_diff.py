"""The admission model against the kubelet's own code: 10,000 seeded scenarios, one harness run.

``tools/admissiondiff`` is compiled from k8s.io/kubernetes of the lab's version (built by
``scripts/setup``; built here when missing) and runs the kubelet's Topology Manager, CPU manager
static policy and Memory Manager static policy on each scenario. Every disagreement fails the test
and is printed as a minimal reproducer (the scenario JSON the harness and
``scenarios.scenario_from_json`` read).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from rollout.kubelet.admission import diff, scenarios

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = 10_000


@pytest.fixture(scope="module")
def harness() -> str:
    out = subprocess.run(
        [str(ROOT / "tools" / "build-admission-harness.sh")],
        check=True,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    return out.stdout.strip().splitlines()[-1]


def test_model_agrees_with_the_kubelet_on_10000_scenarios(harness: str) -> None:
    cases = [scenarios.generate(seed) for seed in range(SCENARIOS)]
    kubelet = diff.run_harness(harness, cases)
    reasons: Counter[str] = Counter()
    failures = []
    for sc, k in zip(cases, kubelet, strict=True):
        m = diff.run_model(sc)
        for p in k.get("pods") or []:
            reasons[p.get("reason") or "admitted"] += 1
        if diff.compare(m, k):
            failures.append(sc)
    reproducers = []
    for sc in failures[:5]:

        def disagrees(s: scenarios.Scenario) -> bool:
            return bool(diff.compare(diff.run_model(s), diff.run_harness(harness, [s])[0]))

        small = diff.shrink(sc, disagrees)
        got = diff.compare(diff.run_model(small), diff.run_harness(harness, [small])[0])
        reproducers.append(f"seed {sc.seed}: {got}\n{json.dumps(small.to_json())}")
    assert not failures, (
        f"{len(failures)} of {SCENARIOS} scenarios disagree; minimal reproducers:\n"
        + "\n\n".join(reproducers)
    )
    # the scenarios exercise every outcome, not only admissions
    for reason in (
        "admitted",
        "TopologyAffinityError",
        "SMTAlignmentError",
        "UnexpectedAdmissionError",
    ):
        assert reasons[reason] > 100, reasons


def test_a_disagreement_is_reported_and_shrunk() -> None:
    sc = scenarios.generate(7)
    model = diff.run_model(sc)
    flipped = json.loads(json.dumps(model))
    last = flipped["pods"][-1]
    last["admit"] = not last["admit"]
    assert diff.compare(model, flipped)
    assert not diff.compare(model, model)

    def disagrees(s: scenarios.Scenario) -> bool:
        return len(s.pods) >= 2  # a stand-in oracle: any scenario with two pods "disagrees"

    small = diff.shrink(sc, disagrees)
    assert len(small.pods) == 2
    assert scenarios.scenario_from_json(json.loads(json.dumps(small.to_json()))).to_json() == (
        small.to_json()
    )
