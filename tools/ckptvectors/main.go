// Command ckptvectors writes and reads cpu_manager_state and memory_manager_state through the
// kubelet's own checkpoint code (pkg/kubelet/cm/{cpumanager,memorymanager}/state) of the
// Kubernetes version in go.mod, so that rollout's Python reader and writer
// (rollout/kubelet/checkpoints.py, memory_state.py) are tested against the real bytes and the
// real error texts. tools/gen-checkpoint-vectors.sh drives it and writes
// tests/fixtures/kubelet/k8s-<version>/.
//
// Usage:
//
//	ckptvectors [-gates G=true,...] cpu-write POLICY SPEC.json   # the file NewCheckpointState +
//	                                                              # the setters write, on stdout
//	ckptvectors cpu-write-v2|cpu-write-v3 POLICY SPEC.json        # the older structs' own
//	                                                              # MarshalCheckpoint
//	ckptvectors [-gates ...] cpu-read POLICY FILE...              # one JSON line per FILE
//	ckptvectors [-gates ...] mem-write POLICY SPEC.json
//	ckptvectors [-gates ...] mem-read POLICY FILE...
//
// A cpu SPEC is {"defaultCpuSet": "0-7", "entries": {pod: {ctr: cpus}}, "podEntries": {pod:
// cpus}, "baselines": {pod: {ctr: cpus}}}; a mem SPEC is {"machineState": ..., "entries": ...,
// "podEntries": ...} in the checkpoint's own JSON shapes.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	cpustate "k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/state"
	memstate "k8s.io/kubernetes/pkg/kubelet/cm/memorymanager/state"
	"k8s.io/utils/cpuset"
)

const (
	cpuFile = "cpu_manager_state"
	memFile = "memory_manager_state"
)

type cpuSpec struct {
	DefaultCPUSet string                       `json:"defaultCpuSet"`
	Entries       map[string]map[string]string `json:"entries"`
	PodEntries    map[string]string            `json:"podEntries"`
	Baselines     map[string]map[string]string `json:"baselines"`
}

type memSpec struct {
	MachineState memstate.NUMANodeMap                `json:"machineState"`
	Entries      memstate.ContainerMemoryAssignments `json:"entries"`
	PodEntries   memstate.PodMemoryAssignments       `json:"podEntries"`
}

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "ckptvectors: "+format+"\n", a...)
	os.Exit(2)
}

func mustSet(s string) cpuset.CPUSet {
	cs, err := cpuset.Parse(s)
	if err != nil {
		die("cpuset %q: %v", s, err)
	}
	return cs
}

func readSpec(path string, into any) {
	b, err := os.ReadFile(path)
	if err != nil {
		die("%v", err)
	}
	if err := json.Unmarshal(b, into); err != nil {
		die("%s: %v", path, err)
	}
}

// tempDir returns a fresh state directory, holding a copy of src as name when src is set.
func tempDir(name, src string) string {
	dir, err := os.MkdirTemp("", "ckptvectors")
	if err != nil {
		die("%v", err)
	}
	if src != "" {
		b, err := os.ReadFile(src)
		if err != nil {
			die("%v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			die("%v", err)
		}
	}
	return dir
}

func emit(dir, name string) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		die("%v", err)
	}
	_, _ = os.Stdout.Write(b)
	_ = os.RemoveAll(dir)
}

// cpuWriteOld writes the V2 or V3 struct as its own MarshalCheckpoint does (the layouts a 1.36
// kubelet writes with PodLevelResourceManagers off or on), for the 1.37 migration vectors.
func cpuWriteOld(version, policy, specPath string) {
	var spec cpuSpec
	readSpec(specPath, &spec)
	var cp interface{ MarshalCheckpoint() ([]byte, error) }
	switch version {
	case "v2":
		cp = &cpustate.CPUManagerCheckpointV2{PolicyName: policy, DefaultCPUSet: spec.DefaultCPUSet, Entries: spec.Entries}
	case "v3":
		pods := cpustate.PodCPUAssignments{}
		for pod, s := range spec.PodEntries {
			pods[pod] = cpustate.PodEntry{CPUSet: mustSet(s)}
		}
		cp = &cpustate.CPUManagerCheckpointV3{PolicyName: policy, DefaultCPUSet: spec.DefaultCPUSet, Entries: spec.Entries, PodEntries: pods}
	}
	b, err := cp.MarshalCheckpoint()
	if err != nil {
		die("%v", err)
	}
	_, _ = os.Stdout.Write(b)
}

func cpuWrite(policy, specPath string) {
	var spec cpuSpec
	readSpec(specPath, &spec)
	dir := tempDir(cpuFile, "")
	st, err := cpustate.NewCheckpointState(klog.Background(), dir, cpuFile, policy, nil)
	if err != nil {
		die("%v", err)
	}
	if spec.DefaultCPUSet != "" {
		st.SetDefaultCPUSet(mustSet(spec.DefaultCPUSet))
	}
	a := cpustate.ContainerCPUAssignments{}
	for pod, ctrs := range spec.Entries {
		a[pod] = map[string]cpuset.CPUSet{}
		for c, s := range ctrs {
			a[pod][c] = mustSet(s)
		}
	}
	if len(a) > 0 {
		st.SetCPUAssignments(a)
	}
	for pod, s := range spec.PodEntries {
		st.SetPodCPUSet(pod, mustSet(s))
	}
	b := cpustate.ContainerCPUBaselines{}
	for pod, ctrs := range spec.Baselines {
		b[pod] = map[string]cpustate.ContainerCPUBaseline{}
		for c, s := range ctrs {
			b[pod][c] = cpustate.ContainerCPUBaseline{Baseline: mustSet(s)}
		}
	}
	if len(b) > 0 {
		st.SetCPUBaselines(b)
	}
	emit(dir, cpuFile)
}

type readResult struct {
	File  string `json:"file"`
	Error string `json:"error,omitempty"`
	// the state restored, in checkpoint shapes
	PolicyName    string                       `json:"policyName,omitempty"`
	DefaultCPUSet *string                      `json:"defaultCpuSet,omitempty"`
	Entries       map[string]map[string]string `json:"entries,omitempty"`
	PodEntries    map[string]string            `json:"podEntries,omitempty"`
	Baselines     map[string]map[string]string `json:"baselines,omitempty"`
	// memory manager
	MachineState memstate.NUMANodeMap                `json:"machineState,omitempty"`
	MemEntries   memstate.ContainerMemoryAssignments `json:"memEntries,omitempty"`
	MemPods      memstate.PodMemoryAssignments       `json:"memPodEntries,omitempty"`
	// whether the kubelet rewrote the file while loading it (it does only for a missing file)
	Rewritten bool `json:"rewritten,omitempty"`
}

func unchanged(dir, name, src string) bool {
	a, _ := os.ReadFile(filepath.Join(dir, name))
	b, _ := os.ReadFile(src)
	return string(a) == string(b)
}

func cpuRead(policy string, files []string) {
	enc := json.NewEncoder(os.Stdout)
	for _, f := range files {
		dir := tempDir(cpuFile, f)
		r := readResult{File: filepath.Base(f)}
		st, err := cpustate.NewCheckpointState(klog.Background(), dir, cpuFile, policy, nil)
		if err != nil {
			r.Error = strings.ReplaceAll(err.Error(), dir, "STATEDIR")
		} else {
			r.PolicyName = policy
			d := st.GetDefaultCPUSet().String()
			r.DefaultCPUSet = &d
			for pod, ctrs := range st.GetCPUAssignments() {
				if r.Entries == nil {
					r.Entries = map[string]map[string]string{}
				}
				r.Entries[pod] = map[string]string{}
				for c, s := range ctrs {
					r.Entries[pod][c] = s.String()
				}
			}
			for pod, e := range st.GetPodCPUAssignments() {
				if r.PodEntries == nil {
					r.PodEntries = map[string]string{}
				}
				r.PodEntries[pod] = e.CPUSet.String()
			}
			for pod, ctrs := range st.GetCPUBaselines() {
				if r.Baselines == nil {
					r.Baselines = map[string]map[string]string{}
				}
				r.Baselines[pod] = map[string]string{}
				for c, s := range ctrs {
					r.Baselines[pod][c] = s.Baseline.String()
				}
			}
			r.Rewritten = !unchanged(dir, cpuFile, f)
		}
		_ = os.RemoveAll(dir)
		if err := enc.Encode(r); err != nil {
			die("%v", err)
		}
	}
}

func memWrite(policy, specPath string) {
	var spec memSpec
	readSpec(specPath, &spec)
	dir := tempDir(memFile, "")
	st, err := memstate.NewCheckpointState(klog.Background(), dir, memFile, policy)
	if err != nil {
		die("%v", err)
	}
	if spec.MachineState != nil {
		st.SetMachineState(spec.MachineState)
	}
	if len(spec.Entries) > 0 {
		st.SetMemoryAssignments(spec.Entries)
	}
	if len(spec.PodEntries) > 0 {
		st.SetPodMemoryAssignments(spec.PodEntries)
	}
	emit(dir, memFile)
}

func memRead(policy string, files []string) {
	enc := json.NewEncoder(os.Stdout)
	for _, f := range files {
		dir := tempDir(memFile, f)
		r := readResult{File: filepath.Base(f)}
		st, err := memstate.NewCheckpointState(klog.Background(), dir, memFile, policy)
		if err != nil {
			r.Error = strings.ReplaceAll(err.Error(), dir, "STATEDIR")
		} else {
			r.PolicyName = policy
			r.MachineState = st.GetMachineState()
			r.MemEntries = st.GetMemoryAssignments()
			r.MemPods = st.GetPodMemoryAssignments()
			r.Rewritten = !unchanged(dir, memFile, f)
		}
		_ = os.RemoveAll(dir)
		if err := enc.Encode(r); err != nil {
			die("%v", err)
		}
	}
}

func main() {
	gates := flag.String("gates", "", "feature gates, G=true,G2=false")
	flag.Parse()
	if *gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*gates); err != nil {
			die("-gates: %v", err)
		}
	}
	args := flag.Args()
	if len(args) < 3 {
		die("usage: ckptvectors [-gates G=true] cpu-write|cpu-read|mem-write|mem-read POLICY FILE...")
	}
	switch args[0] {
	case "cpu-write":
		cpuWrite(args[1], args[2])
	case "cpu-write-v2":
		cpuWriteOld("v2", args[1], args[2])
	case "cpu-write-v3":
		cpuWriteOld("v3", args[1], args[2])
	case "cpu-read":
		cpuRead(args[1], args[2:])
	case "mem-write":
		memWrite(args[1], args[2])
	case "mem-read":
		memRead(args[1], args[2:])
	default:
		die("unknown command %q", args[0])
	}
}
