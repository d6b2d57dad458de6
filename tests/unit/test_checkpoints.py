"""Checkpoint formats, checksums (against the kubelet's own test vectors), start errors, resets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.kubelet import checkpoints as ck
from rollout.kubelet import memory_state as mck

CPU_PATH = "/var/lib/kubelet/cpu_manager_state"
MEM_PATH = "/var/lib/kubelet/memory_manager_state"


# Values from kubernetes pkg/kubelet/cm/cpumanager/state/state_checkpoint_test.go.
@pytest.mark.parametrize(
    ("policy", "default", "entries", "checksum"),
    [
        ("none", "4-6", {}, 354655845),
        ("none", "1-3", {"pod": {"container1": "4-6", "container2": "1-3"}}, 3610638499),
        ("other", "1-3", {}, 1394507217),
        ("none", "1.3", {}, 3021697696),
    ],
)
def test_cpu_checksum_matches_kubelet_vectors(
    policy: str, default: str, entries: dict[str, dict[str, str]], checksum: int
) -> None:
    assert ck.CPUCheckpoint(policy, default, entries).computed_checksum() == checksum


def test_memory_checksum_matches_kubelet_vector() -> None:
    # memorymanager/state/state_checkpoint_test.go "Restore checkpoint from v1": the V1 struct has
    # no PodEntries field; everything else in the hashed text is shared with the V2 struct.
    table = mck.MemoryTable(2048, 512, 1536, 512, 1024)
    cp = mck.MemoryCheckpoint(
        "static",
        {0: mck.NUMAState(0, {"memory": table}, ())},
        {"pod": {"container1": (mck.MemoryBlock((0,), "memory", 512),)}},
    )
    v1_text = cp.spew().replace(" PodEntries:(state.PodMemoryAssignments)map[]", "")
    assert ck.fnv32a(v1_text) == 4215593881


def test_cpu_round_trip_and_format() -> None:
    cp = ck.cpu_checkpoint("static", range(8), {"uid-1": {"app": "2-3"}})
    text = ck.render_cpu(cp)
    assert json.loads(text) == {
        "policyName": "static",
        "defaultCpuSet": "0-7",
        "entries": {"uid-1": {"app": "2-3"}},
        "checksum": cp.checksum,
    }
    assert ck.parse_cpu(text) == cp
    assert "entries" not in ck.render_cpu(ck.cpu_checkpoint("none", (), {}))


def test_cpu_parse_accepts_kubelet_case_and_rejects_bad_checksum() -> None:
    good = '{"policyName":"none","defaultCPUSet":"4-6","entries":{},"checksum":354655845}'
    assert ck.parse_cpu(good).default_cpu_set == "4-6"
    with pytest.raises(ck.CheckpointError, match="checkpoint is corrupted"):
        ck.parse_cpu(good.replace("354655845", "1337"))
    with pytest.raises(ck.CheckpointError):
        ck.parse_cpu("{")


@pytest.mark.parametrize(
    ("state", "policy", "reserved", "strict", "expected"),
    [
        (ck.cpu_initial_state("static", range(8), {0, 1}), "static", {0, 1}, False, None),
        (
            ck.cpu_initial_state("none", range(8), ()),
            "static",
            {0, 1},
            False,
            'could not restore state from checkpoint: configured policy "static" differs from '
            'state checkpoint policy "none", please drain this node and delete the CPU manager '
            f'checkpoint file "{CPU_PATH}" before restarting Kubelet',
        ),
        (
            ck.cpu_initial_state("static", range(8), {0, 1}),
            "none",
            (),
            False,
            'could not restore state from checkpoint: configured policy "none" differs from '
            'state checkpoint policy "static", please drain this node and delete the CPU manager '
            f'checkpoint file "{CPU_PATH}" before restarting Kubelet',
        ),
        (
            ck.cpu_checkpoint("static", [0, 1, 4, 5, 6, 7], {"p": {"c": "2-3"}}),
            "static",
            {0, 1, 2},
            False,
            'not all reserved cpus: "0-2" are present in defaultCpuSet: "0-1,4-7"',
        ),
        (
            ck.cpu_initial_state("static", range(8), {0, 1}),
            "static",
            {0, 1},
            True,
            'some of strictly reserved cpus: "0-1" are present in defaultCpuSet: "0-7"',
        ),
        (
            ck.cpu_checkpoint("static", range(8), {"p": {"c": "2-3"}}),
            "static",
            {0},
            False,
            'pod: p, container: c cpuset: "2-3" overlaps with default cpuset "0-7"',
        ),
        (
            ck.cpu_checkpoint("static", range(4), {}),
            "static",
            {0},
            False,
            'current set of available CPUs "0-7" doesn\'t match with CPUs in state "0-3"',
        ),
    ],
)
def test_cpu_start_errors(
    state: ck.CPUCheckpoint, policy: str, reserved: set[int], strict: bool, expected: str | None
) -> None:
    got = ck.cpu_start_error(
        CPU_PATH, policy, state, all_cpus=range(8), reserved=reserved, strict=strict
    )
    assert got == expected


def test_memory_round_trip_and_errors() -> None:
    ms = mck.memory_machine_state({0: 1 << 30, 1: 1 << 30}, {0: 100 << 20})
    cp = mck.memory_checkpoint("Static", ms)
    assert mck.parse_memory(mck.render_memory(cp)) == cp
    assert mck.memory_start_error(MEM_PATH, "Static", cp, ms) is None
    other = mck.memory_machine_state({0: 1 << 30, 1: 1 << 30}, {0: 200 << 20})
    assert mck.memory_start_error(MEM_PATH, "Static", cp, other) == (
        "[memorymanager] the expected machine state is different from the real one"
    )
    none = mck.memory_checkpoint("None", {})
    assert mck.memory_start_error(MEM_PATH, "Static", none, ms) == (
        'could not restore state from checkpoint: [memorymanager] configured policy "Static" '
        'differs from state checkpoint policy "None", please drain this node and delete the '
        f'memory manager checkpoint file "{MEM_PATH}" before restarting Kubelet'
    )
    with pytest.raises(ck.CheckpointError, match="corrupted"):
        mck.parse_memory(mck.render_memory(cp).replace(str(cp.checksum), "7"))


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ({}, {}, ()),
        ({}, {"cpuManagerPolicy": "none"}, ()),
        ({}, {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0-1"}, ("cpu_manager_state",)),
        (
            {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,1"},
            {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0-1"},
            (),
        ),
        (
            {"cpuManagerPolicy": "static", "kubeReserved": {"cpu": "1"}},
            {"cpuManagerPolicy": "static", "kubeReserved": {"cpu": "2"}},
            ("cpu_manager_state",),
        ),
        ({"kubeReserved": {"cpu": "1"}}, {"kubeReserved": {"cpu": "2"}}, ()),
        (
            {"cpuManagerPolicy": "static", "cpuManagerPolicyOptions": {}},
            {
                "cpuManagerPolicy": "static",
                "cpuManagerPolicyOptions": {"strict-cpu-reservation": "true"},
            },
            ("cpu_manager_state",),
        ),
        ({"topologyManagerPolicy": "none"}, {"topologyManagerPolicy": "single-numa-node"}, ()),
        ({}, {"memoryManagerPolicy": "Static"}, ("memory_manager_state",)),
        (
            {"memoryManagerPolicy": "Static", "systemReserved": {"memory": "1Gi"}},
            {"memoryManagerPolicy": "Static", "systemReserved": {"memory": "2Gi"}},
            ("memory_manager_state",),
        ),
        (
            {"cpuManagerPolicy": "static", "memoryManagerPolicy": "Static"},
            {"memoryManagerPolicy": "None"},
            ("cpu_manager_state", "memory_manager_state"),
        ),
    ],
)
def test_reset_needed(before: dict, after: dict, expected: tuple[str, ...]) -> None:  # type: ignore[type-arg]
    assert ck.reset_needed(before, after) == expected


# ---------------------------------------------------------- checkpoint-format feature gates
PLRM = {"featureGates": {"PodLevelResourceManagers": True}}


@pytest.mark.parametrize("gate", ck.CHECKPOINT_GATES)
def test_gate_flipped_with_a_policy_change_is_refused(gate: str) -> None:
    class Where:
        file = "/etc/kubernetes/kubelet.conf.d/50-rollout.conf"
        line = 9

    before = {"cpuManagerPolicy": "none"}
    after = {"cpuManagerPolicy": "static", "featureGates": {gate: True}}
    [f] = ck.gate_flip_findings(before, after, {"featureGates": Where()})
    assert (f.severity, f.field, f.file, f.line) == (
        ck.Severity.ERROR,
        f"featureGates.{gate}",
        Where.file,
        9,
    )
    assert f.message.startswith(
        f"feature gate {gate} changes from false to true in the same change as cpuManagerPolicy: "
        "the gate changes the format of cpu_manager_state and memory_manager_state"
    )
    # and back: switching it off with a policy change is refused the same way
    [back] = ck.gate_flip_findings(after, before)
    assert "changes from true to false" in back.message


def test_gate_alone_or_policy_alone_is_not_refused_and_a_flip_resets_both_files() -> None:
    assert ck.gate_flip_findings({}, PLRM) == []  # the gate in a change of its own
    assert ck.reset_needed({}, PLRM) == (ck.CPU_STATE_FILE, ck.MEMORY_STATE_FILE)
    same = {**PLRM, "cpuManagerPolicy": "none"}
    assert ck.gate_flip_findings(same, {**PLRM, "cpuManagerPolicy": "static"}) == []
    # an explicit false is the default, not a flip
    off = {"featureGates": {"PodLevelResourceManagers": False}}
    assert ck.gate_flips({}, off) == ()
    assert ck.gate_flip_findings({}, {**off, "topologyManagerPolicy": "single-numa-node"}) == []


# ------------------------------------------------------------------ 1.37: memory manager V3
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kubelet"
V3_FIXTURE = FIXTURES / "memory_manager_state-v3-kubelet-test.json"
#: the payload of the kubelet's V3 test cases (memorymanager/state/state_checkpoint_test.go)
KUBELET_V3_DATA = json.loads(V3_FIXTURE.read_text())["data"]
#: the kubelet test's V1 file (its "Restore checkpoint from v1 (migration)" case)
KUBELET_V1_FILE = (
    '{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":'
    '{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},'
    '"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory",'
    '"size":512}]}},"checksum":4215593881}'
)


@pytest.mark.parametrize(
    ("data", "checksum"),
    [
        # cpumanager state_checkpoint_test.go in kubernetes#137820 (data-string checkpoint)
        ('{"policyName":"none","defaultCPUSet":"4-6"}', 657950972),
        # memorymanager state_checkpoint_test.go (V3): "Restore valid checkpoint"
        (KUBELET_V3_DATA, 1849615440),
        # ... and "Restore checkpoint ignoring unknown fields in data section"
        ('{"unknownField":"value",' + KUBELET_V3_DATA[1:], 2100279793),
    ],
)
def test_data_checksum_matches_kubelet_vectors(data: str, checksum: int) -> None:
    assert ck.data_checksum(data) == checksum


def test_memory_v3_is_read_from_data_and_checked_against_the_config() -> None:
    cp = mck.parse_memory(V3_FIXTURE.read_text())
    # the inline V1 fields say "other", 5 assignments, containerX: the kubelet ignores them
    assert (cp.version, cp.policy_name) == (3, "static")
    assert cp.entries == {"pod": {"container1": (mck.MemoryBlock((0,), "memory", 512),)}}
    assert cp.machine_state[0].memory_map["memory"] == mck.MemoryTable(2048, 512, 1536, 512, 1024)
    assert cp.machine_state[0].number_of_assignments == 0
    # state vs config, in the kubelet's words (its test: policy "none" over this file)
    assert mck.memory_start_error(MEM_PATH, "None", cp, {}) == (
        'could not restore state from checkpoint: [memorymanager] configured policy "None" '
        'differs from state checkpoint policy "static", please drain this node and delete the '
        f'memory manager checkpoint file "{MEM_PATH}" before restarting Kubelet'
    )
    # (the kubelet's test says "static"; the real policy is "Static", and case matters)
    table = mck.MemoryTable(2048, 512, 1536, 512, 1024)
    ms = {0: mck.NUMAState(0, {"memory": table}, ())}
    live = mck.parse_memory(mck.render_memory_v3(mck.memory_checkpoint("Static", ms, cp.entries)))
    assert mck.memory_start_error(MEM_PATH, "Static", live, ms) is None
    changed = {0: mck.NUMAState(0, {"memory": mck.MemoryTable(2048, 256, 1792, 512, 1280)}, ())}
    assert mck.memory_start_error(MEM_PATH, "Static", live, changed) == (
        "[memorymanager] the expected machine state is different from the real one"
    )


def _v3_case(**changes: object) -> str:
    doc = json.loads(V3_FIXTURE.read_text())
    # a valid inline V1 part: the kubelet must still not fall back to it
    doc.update(json.loads(KUBELET_V1_FILE))
    for k, v in changes.items():
        if v is None:
            doc.pop(k, None)
        else:
            doc[k] = v
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (_v3_case(dataChecksum=1234), "could not load v3 checkpoint: checkpoint is corrupted"),
        (_v3_case(dataChecksum=None), "could not load v3 checkpoint: checkpoint is corrupted"),
        (
            _v3_case(data=None, dataChecksum=1234),
            "could not load v3 checkpoint: failed to deserialize memory manager checkpoint data: "
            "unexpected end of JSON input",
        ),
        (
            _v3_case(data="{"),
            "could not load v3 checkpoint: failed to deserialize memory manager checkpoint data: "
            "unexpected end of JSON input",
        ),
    ],
)
def test_a_broken_v3_file_is_refused_without_falling_back(text: str, error: str) -> None:
    # cases and messages of the kubelet's own V3 tests ("Fail to restore checkpoint ...")
    with pytest.raises(ck.CheckpointError) as e:
        mck.parse_memory(text)
    assert str(e.value) == error
    # the lab kubelet wraps it as the kubelet's NewCheckpointState does
    wrapped = mck.MEMORY_RESTORE_ERROR.format(err=str(e.value), path=MEM_PATH)
    assert wrapped.startswith(f"could not restore state from checkpoint: {error}, please drain")


def test_v1_checksum_files_are_read_as_the_kubelet_migrates_them() -> None:
    # the kubelet tries V2, then V1: a file with the V1 struct's checksum loads
    cp = mck.parse_memory(KUBELET_V1_FILE)
    assert cp.version == 2 and cp.checksum == cp.v1_checksum() == 4215593881
    with pytest.raises(ck.CheckpointError, match="checkpoint is corrupted"):
        mck.parse_memory(KUBELET_V1_FILE.replace("4215593881", "101010"))


def test_memory_v3_render_is_the_kubelets_bytes_and_readable_by_older_kubelets() -> None:
    ms = {0: mck.NUMAState(0, {"memory": mck.MemoryTable(2048, 512, 1536, 512, 1024)}, ())}
    entries = {"pod": {"container1": (mck.MemoryBlock((0,), "memory", 512),)}}
    cp = mck.memory_checkpoint("static", ms, entries)
    text = mck.render_memory_v3(cp)
    doc = json.loads(text)
    assert doc["data"] == KUBELET_V3_DATA  # byte for byte the kubelet's serialized payload
    assert doc["dataChecksum"] == 1849615440
    assert doc["checksum"] == 4215593881  # inline V1 part, hashed as a V1 file
    assert list(doc) == [
        "policyName",
        "machineState",
        "entries",
        "checksum",
        "data",
        "dataChecksum",
    ]
    back = mck.parse_memory(text)
    assert (back.version, back.policy_name, back.entries, back.machine_state) == (
        3,
        "static",
        entries,
        ms,
    )
    # a kubelet without the V3 code reads the inline V1 fields and their checksum
    old = mck.parse_memory(text, reads_v3=False)
    assert (old.version, old.policy_name, old.entries) == (2, "static", entries)
    # more than ten NUMA nodes: encoding/json sorts map keys as strings
    many = {n: mck.NUMAState(0, {}, (n,)) for n in range(11)}
    keys = list(
        json.loads(mck.render_memory_v3(mck.memory_checkpoint("None", many)))["machineState"]
    )
    assert keys == sorted(str(n) for n in range(11))


# --------------------------------------------- 1.37: CPU manager V4, against the kubelet's code
#: written and read by the kubelet's own checkpoint code (tools/gen-checkpoint-vectors.sh)
K8S = FIXTURES / "checkpoints-v1.37.2"
GATES = {"PodLevelResourceManagers": True, "InPlacePodVerticalScalingExclusiveCPUs": True}


def _kubelet_reads() -> list[tuple[int, str, str, dict[str, bool], dict[str, object]]]:
    out = []
    for tag, minor in (("k137", 37), ("k136", 36)):
        for cfg, policy, gates in (
            ("static", "static", {}),
            ("none", "none", {}),
            ("static-gated", "static", GATES),
        ):
            for line in (K8S / f"{tag}-cpu-{cfg}.jsonl").read_text().splitlines():
                out.append((minor, cfg, policy, gates, json.loads(line)))
    return out


def _restored(
    text: str, minor: int, policy: str, gates: dict[str, bool], name: str
) -> dict[str, object]:
    """What NewCheckpointState of that kubelet returns for the file, in the harness's shape."""
    path = "STATEDIR/cpu_manager_state"
    got: dict[str, object] = {"file": name}
    try:
        cp = ck.parse_cpu(text, kubelet_minor=minor, gates=gates)
    except ck.CheckpointError as e:
        got["error"] = ck.CPU_RESTORE_ERROR.format(err=str(e), path=path)
        return got
    err = ck.cpu_start_error(path, policy, cp, all_cpus=(), reserved=(), kubelet_minor=minor)
    if err is not None and err.startswith("could not restore"):  # restoreState's own checks
        got["error"] = err
        return got
    got.update(policyName=policy, defaultCpuSet=cp.default_cpu_set)
    if cp.entries:
        got["entries"] = cp.entries
    if gates.get("PodLevelResourceManagers") and cp.pod_entries:
        got["podEntries"] = cp.pod_entries
    # 1.37's restoreState takes the entries as baselines when the file has none
    ippvs = minor >= 37 and gates.get("InPlacePodVerticalScalingExclusiveCPUs")
    if ippvs and (cp.baselines or cp.entries):
        got["baselines"] = cp.baselines or cp.entries
    return got


@pytest.mark.parametrize(
    ("minor", "cfg", "policy", "gates", "want"),
    _kubelet_reads(),
    ids=lambda v: None if isinstance(v, (dict, int)) else str(v),
)
def test_cpu_file_is_read_as_the_kubelets_own_code_reads_it(
    minor: int, cfg: str, policy: str, gates: dict[str, bool], want: dict[str, object]
) -> None:
    # every V1..V4 file, whole or damaged, read by the 1.37.2 and the 1.36.3 checkpoint code:
    # the same record or the same error, word for word
    name = str(want["file"])
    text = (K8S / "read" / name).read_text()
    assert _restored(text, minor, policy, gates, name) == want


@pytest.mark.parametrize("name", sorted(p.name for p in (K8S / "write").glob("cpu-*.json")))
def test_cpu_render_is_the_kubelets_bytes(name: str) -> None:
    text = (K8S / "write" / name).read_text()
    cp = ck.parse_cpu(text, gates={"PodLevelResourceManagers": True})
    again = ck.cpu_checkpoint(
        cp.policy_name,
        ck.cpuset.parse(cp.default_cpu_set),
        cp.entries,
        version=cp.version,
        pod_entries=cp.pod_entries,
        baselines=cp.baselines,
    )
    if cp.version == 3:  # the V3 struct (1.36 with PodLevelResourceManagers): its checksum
        assert again.checksum == cp.checksum == json.loads(text)["checksum"]
    else:
        assert (ck.render_cpu_v4 if cp.version == 4 else ck.render_cpu)(again) == text


def test_v4_layout_fields_and_checksums() -> None:
    text = (K8S / "write" / "cpu-v4-static-gated.json").read_text()
    doc = json.loads(text)
    assert list(doc) == [
        "policyName",
        "defaultCpuSet",
        "entries",
        "checksum",
        "data",
        "dataChecksum",
    ]
    cp = ck.parse_cpu(text)
    assert (cp.version, cp.policy_name, cp.default_cpu_set) == (4, "static", "0-1,6-7")
    assert cp.entries == {"uid-1": {"app": "2-3"}}
    assert cp.pod_entries == {"uid-2": "4-5"}
    assert cp.baselines == {"uid-1": {"app": "2"}}
    # the inline part is a V2 file of the same fields (what a 1.36 kubelet checks) ...
    v2 = ck.cpu_checkpoint("static", ck.cpuset.parse("0-1,6-7"), {"uid-1": {"app": "2-3"}})
    assert doc["checksum"] == v2.checksum == cp.checksum
    # ... and dataChecksum is checksum.New(data)
    assert doc["dataChecksum"] == ck.data_checksum(doc["data"])
    # 1.37 does not check the inline checksum, 1.36 reads nothing else
    stale = json.dumps({**doc, "checksum": 1234})
    assert ck.parse_cpu(stale).entries == cp.entries
    with pytest.raises(ck.CheckpointError) as e:
        ck.parse_cpu(stale, kubelet_minor=36)
    assert str(e.value) == (
        "json: cannot unmarshal object into Go struct field CPUManagerCheckpointV1.entries of "
        "type string"
    )
    old = ck.parse_cpu(text, kubelet_minor=36)
    assert (old.version, old.entries, old.pod_entries, old.baselines) == (2, cp.entries, {}, {})


def test_a_rollback_to_1_36_reads_the_inline_fields_and_loses_pod_entries() -> None:
    # the downgrade path: 1.36 starts on a 1.37 file with the same policy, pool and container
    # CPUs; the pod-level CPUs (podEntries) and baselines of data are not read, with or without
    # the PodLevelResourceManagers gate; the start checks see what 1.37 saw
    text = (K8S / "write" / "cpu-v4-static-gated.json").read_text()
    new = ck.parse_cpu(text, gates=GATES)
    for gates in ({}, GATES):
        old = ck.parse_cpu(text, kubelet_minor=36, gates=gates)
        assert (old.policy_name, old.default_cpu_set, old.entries) == (
            new.policy_name,
            new.default_cpu_set,
            new.entries,
        )
        assert old.pod_entries == {}
        args = {"all_cpus": range(8), "reserved": {0, 1}}
        assert ck.cpu_start_error(CPU_PATH, "none", old, kubelet_minor=36, **args) == (
            ck.cpu_start_error(CPU_PATH, "none", new, **args)
        )


def test_the_default_cpu_set_parse_error_changed_case_in_1_37() -> None:
    cp = ck.CPUCheckpoint("static", "0-x")
    args = {"all_cpus": range(8), "reserved": ()}
    assert 'could not parse default CPU set "0-x": strconv.Atoi' in str(
        ck.cpu_start_error(CPU_PATH, "static", cp, **args)
    )
    assert 'could not parse default cpu set "0-x": strconv.Atoi' in str(
        ck.cpu_start_error(CPU_PATH, "static", cp, kubelet_minor=36, **args)
    )


def test_cpu_layout_by_kubelet_version() -> None:
    assert [ck.cpu_layout_for(m) for m in (34, 35, 36, 37, None)] == [2, 2, 2, 4, 4]


@pytest.mark.parametrize("tag", ["k137", "k136"])
def test_memory_v3_from_the_kubelets_code(tag: str) -> None:
    # the 1.37.2 memory manager's own V3 bytes: rendered byte for byte, and read by 1.37.2 (data)
    # and by 1.36.3 (inline V1 fields) to the same state
    for line in (K8S / f"{tag}-memory-static.jsonl").read_text().splitlines():
        want = json.loads(line)
        text = (K8S / "read" / want["file"]).read_text()
        cp = mck.parse_memory(text, reads_v3=tag == "k137")
        assert cp.version == (3 if tag == "k137" else 2)
        again = mck.memory_checkpoint(cp.policy_name, cp.machine_state, cp.entries)
        assert mck.render_memory_v3(again) == (K8S / "write" / want["file"]).read_text()
        err = mck.memory_start_error(
            "STATEDIR/memory_manager_state", "Static", cp, cp.machine_state
        )
        if "error" in want:
            assert err == want["error"]
            continue
        assert err is None
        ms = want["machineState"]
        assert {str(n): s.number_of_assignments for n, s in cp.machine_state.items()} == {
            n: s["numberOfAssignments"] for n, s in ms.items()
        }
        assert {
            p: {c: [b.size for b in bl] for c, bl in ctrs.items()} for p, ctrs in cp.entries.items()
        } == {
            p: {c: [b["size"] for b in bl] for c, bl in ctrs.items()}
            for p, ctrs in want["memEntries"].items()
        }
