// Command ckptvectors (k136) reads cpu_manager_state and memory_manager_state through the
// checkpoint code of the 1.36 kubelet (go.mod: k8s.io/kubernetes v1.36.3), to say what a
// kubelet rolled back from 1.37 does with the files 1.37 wrote. Same output as ../main.go's
// cpu-read and mem-read; 1.36 has no CPU baselines.
//
// Usage: ckptvectors136 [-gates G=true,...] cpu-read|mem-read POLICY FILE...
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
)

const (
	cpuFile = "cpu_manager_state"
	memFile = "memory_manager_state"
)

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "ckptvectors: "+format+"\n", a...)
	os.Exit(2)
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
			r.Rewritten = !unchanged(dir, cpuFile, f)
		}
		_ = os.RemoveAll(dir)
		if err := enc.Encode(r); err != nil {
			die("%v", err)
		}
	}
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
		die("usage: ckptvectors [-gates G=true] cpu-read|mem-read POLICY FILE...")
	}
	switch args[0] {
	case "cpu-read":
		cpuRead(args[1], args[2:])
	case "mem-read":
		memRead(args[1], args[2:])
	default:
		die("unknown command %q", args[0])
	}
}
