// Command admissiondiff runs pod admission through the kubelet's own Topology Manager, CPU
// manager static policy and Memory Manager static policy (k8s.io/kubernetes of the lab's version),
// for the differential test of rollout's admission model (tests/unit/test_admission_diff.py).
//
// Input (stdin): one JSON scenario per line. Output (stdout): one JSON result per line, in order.
// Everything runs in one process; no kubelet, no sysfs, no checkpoint files.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"

	"github.com/go-logr/logr"
	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager"
	cpustate "k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/state"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager/topology"
	"k8s.io/kubernetes/pkg/kubelet/cm/memorymanager"
	memstate "k8s.io/kubernetes/pkg/kubelet/cm/memorymanager/state"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/utils/cpuset"
)

type cpuIn struct {
	ID     int `json:"id"`
	Core   int `json:"core"`
	Socket int `json:"socket"`
	NUMA   int `json:"numa"`
}

type numaIn struct {
	ID        int      `json:"id"`
	Memory    uint64   `json:"memory"`
	Hugepages uint64   `json:"hugepages2Mi"` // number of 2Mi pages
	Distances []uint64 `json:"distances"`
}

type containerIn struct {
	Name      string `json:"name"`
	CPUMilli  int64  `json:"cpuMilli"`
	Memory    int64  `json:"memory"`
	Hugepages int64  `json:"hugepages2Mi"` // bytes
	Init      bool   `json:"init"`
}

type podIn struct {
	UID        string        `json:"uid"`
	Guaranteed bool          `json:"guaranteed"`
	Containers []containerIn `json:"containers"`
}

type scenario struct {
	CPUs            []cpuIn                      `json:"cpus"`
	NUMA            []numaIn                     `json:"numa"`
	CPUPolicy       string                       `json:"cpuPolicy"`
	CPUOptions      map[string]string            `json:"cpuOptions"`
	ReservedCPUs    []int                        `json:"reservedCPUs"`
	NumReservedCPUs int                          `json:"numReservedCPUs"`
	MemoryPolicy    string                       `json:"memoryPolicy"`
	ReservedMemory  map[string]map[string]uint64 `json:"reservedMemory"`
	TopologyPolicy  string                       `json:"topologyPolicy"`
	Scope           string                       `json:"scope"`
	TopologyOptions map[string]string            `json:"topologyOptions"`
	Pods            []podIn                      `json:"pods"`
}

type podOut struct {
	UID     string                      `json:"uid"`
	Admit   bool                        `json:"admit"`
	Reason  string                      `json:"reason,omitempty"`
	Message string                      `json:"message,omitempty"`
	CPUs    map[string][]int            `json:"cpus,omitempty"`
	Memory  map[string]map[string][]int `json:"memory,omitempty"`
}

type result struct {
	Error string   `json:"error,omitempty"`
	Pods  []podOut `json:"pods,omitempty"`
}

type cpuProvider struct {
	p   cpumanager.Policy
	s   cpustate.State
	log logr.Logger
}

func (c *cpuProvider) GetTopologyHints(pod *v1.Pod, ctr *v1.Container) map[string][]topologymanager.TopologyHint {
	return c.p.GetTopologyHints(c.log, c.s, pod, ctr)
}
func (c *cpuProvider) GetPodTopologyHints(pod *v1.Pod) map[string][]topologymanager.TopologyHint {
	return c.p.GetPodTopologyHints(c.log, c.s, pod)
}
func (c *cpuProvider) AllocatePod(pod *v1.Pod) error { return c.p.AllocatePod(c.log, c.s, pod) }
func (c *cpuProvider) Allocate(pod *v1.Pod, ctr *v1.Container) error {
	return c.p.Allocate(c.log, c.s, pod, ctr)
}

type memProvider struct {
	p   memorymanager.Policy
	s   memstate.State
	log klog.Logger
}

func (m *memProvider) GetTopologyHints(pod *v1.Pod, ctr *v1.Container) map[string][]topologymanager.TopologyHint {
	return m.p.GetTopologyHints(m.log, m.s, pod, ctr)
}
func (m *memProvider) GetPodTopologyHints(pod *v1.Pod) map[string][]topologymanager.TopologyHint {
	return m.p.GetPodTopologyHints(m.log, m.s, pod)
}
func (m *memProvider) AllocatePod(pod *v1.Pod) error { return m.p.AllocatePod(m.log, m.s, pod) }
func (m *memProvider) Allocate(pod *v1.Pod, ctr *v1.Container) error {
	return m.p.Allocate(m.log, m.s, pod, ctr)
}

func buildPod(in podIn) *v1.Pod {
	pod := &v1.Pod{}
	pod.UID = types.UID(in.UID)
	pod.Name = in.UID
	pod.Namespace = "default"
	for _, c := range in.Containers {
		req := v1.ResourceList{}
		if c.CPUMilli > 0 {
			req[v1.ResourceCPU] = *resource.NewMilliQuantity(c.CPUMilli, resource.DecimalSI)
		}
		if c.Memory > 0 {
			req[v1.ResourceMemory] = *resource.NewQuantity(c.Memory, resource.BinarySI)
		}
		if c.Hugepages > 0 {
			req[v1.ResourceName("hugepages-2Mi")] = *resource.NewQuantity(c.Hugepages, resource.BinarySI)
		}
		ctr := v1.Container{Name: c.Name, Resources: v1.ResourceRequirements{Requests: req}}
		if in.Guaranteed {
			ctr.Resources.Limits = req.DeepCopy()
		}
		if c.Init {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, ctr)
		} else {
			pod.Spec.Containers = append(pod.Spec.Containers, ctr)
		}
	}
	return pod
}

func run(sc scenario) (res result) {
	defer func() {
		if r := recover(); r != nil {
			res = result{Error: fmt.Sprintf("panic: %v", r)}
		}
	}()
	log := logr.Discard()
	var nodes []cadvisorapi.Node
	for _, n := range sc.NUMA {
		node := cadvisorapi.Node{Id: n.ID, Memory: n.Memory, Distances: n.Distances}
		// cadvisor reports every supported page size, with 0 pages where none are configured
		node.HugePages = []cadvisorapi.HugePagesInfo{{PageSize: 2048, NumPages: n.Hugepages}}
		nodes = append(nodes, node)
	}
	tm, err := topologymanager.NewManager(nodes, sc.TopologyPolicy, sc.Scope, sc.TopologyOptions)
	if err != nil {
		return result{Error: "topologymanager: " + err.Error()}
	}
	details := topology.CPUDetails{}
	cores, sockets, numas := map[int]bool{}, map[int]bool{}, map[int]bool{}
	for _, c := range sc.CPUs {
		details[c.ID] = topology.CPUInfo{NUMANodeID: c.NUMA, SocketID: c.Socket, CoreID: c.Core, UncoreCacheID: c.Socket}
		cores[c.Core], sockets[c.Socket], numas[c.NUMA] = true, true, true
	}
	topo := &topology.CPUTopology{NumCPUs: len(sc.CPUs), NumCores: len(cores), NumUncoreCache: len(sockets),
		NumSockets: len(sockets), NumNUMANodes: len(numas), CPUDetails: details}
	var cpuP *cpuProvider
	if sc.CPUPolicy == "static" {
		p, err := cpumanager.NewStaticPolicy(log, topo, sc.NumReservedCPUs, cpuset.New(sc.ReservedCPUs...), tm, sc.CPUOptions)
		if err != nil {
			return result{Error: "cpumanager: " + err.Error()}
		}
		s := cpustate.NewMemoryState(log)
		if err := p.Start(log, s); err != nil {
			return result{Error: "cpumanager start: " + err.Error()}
		}
		cpuP = &cpuProvider{p, s, log}
		tm.AddHintProvider(log, cpuP)
	}
	var memP *memProvider
	if sc.MemoryPolicy == "Static" {
		reserved := map[int]map[v1.ResourceName]uint64{}
		for k, v := range sc.ReservedMemory {
			id, _ := strconv.Atoi(k)
			reserved[id] = map[v1.ResourceName]uint64{}
			for r, b := range v {
				reserved[id][v1.ResourceName(r)] = b
			}
		}
		mi := &cadvisorapi.MachineInfo{Topology: nodes}
		p, err := memorymanager.NewPolicyStatic(log, mi, reserved, tm)
		if err != nil {
			return result{Error: "memorymanager: " + err.Error()}
		}
		s := memstate.NewMemoryState(log)
		if err := p.Start(log, s); err != nil {
			return result{Error: "memorymanager start: " + err.Error()}
		}
		memP = &memProvider{p, s, log}
		tm.AddHintProvider(log, memP)
	}
	for _, pin := range sc.Pods {
		pod := buildPod(pin)
		r := tm.Admit(&lifecycle.PodAdmitAttributes{Pod: pod})
		out := podOut{UID: pin.UID, Admit: r.Admit, Reason: r.Reason, Message: r.Message}
		all := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
		if !r.Admit {
			// the kubelet frees what a rejected pod got (removeStaleState on the next Allocate)
			for _, c := range all {
				if cpuP != nil {
					_ = cpuP.p.RemoveContainer(log, cpuP.s, pin.UID, c.Name)
				}
				if memP != nil {
					memP.p.RemoveContainer(log, memP.s, pin.UID, c.Name)
				}
			}
		} else {
			if cpuP != nil {
				out.CPUs = map[string][]int{}
				for _, c := range all {
					if cs, ok := cpuP.s.GetCPUSet(pin.UID, c.Name); ok {
						out.CPUs[c.Name] = cs.List()
					}
				}
			}
			if memP != nil {
				out.Memory = map[string]map[string][]int{}
				for _, c := range all {
					for _, b := range memP.s.GetMemoryBlocks(pin.UID, c.Name) {
						if out.Memory[c.Name] == nil {
							out.Memory[c.Name] = map[string][]int{}
						}
						nb := append([]int{}, b.NUMAAffinity...)
						sort.Ints(nb)
						out.Memory[c.Name][string(b.Type)] = nb
					}
				}
			}
		}
		res.Pods = append(res.Pods, out)
	}
	return res
}

func main() {
	// align-by-socket and distribute-cpus-across-cores are alpha options
	_ = utilfeature.DefaultMutableFeatureGate.Set("CPUManagerPolicyAlphaOptions=true")
	// the kubelet's packages log every hint at level 0; formatting them costs more than the work
	klog.SetLogger(logr.Discard())
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		var sc scenario
		if err := json.Unmarshal(in.Bytes(), &sc); err != nil {
			_ = enc.Encode(result{Error: "bad scenario: " + err.Error()})
			continue
		}
		_ = enc.Encode(run(sc))
	}
}
