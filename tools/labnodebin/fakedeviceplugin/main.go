// Command fakedeviceplugin is a kubelet device plugin (API v1beta1) that advertises
// simulated devices, each with its NUMA node, so the kubelet's device manager gives
// real topology hints and writes its real checkpoint in a rollout lab node.
//
// It registers with the kubelet at <plugin-dir>/kubelet.sock and registers again
// whenever the kubelet restarts (the kubelet recreates its socket and removes every
// other socket in the directory when it starts).
//
// Device health and the plugin's lifecycle follow two files, polled every 0.5 s, so
// `rollout lab fault` can fail a device or the plugin from outside the node:
//   - the devices file: "ID=NUMA" healthy, "ID=NUMA:Unhealthy" unhealthy; a change is
//     sent to the kubelet on the open ListAndWatch stream, as a real plugin's health
//     check does;
//   - the state file (-state-file): "stopped" stops serving (the gRPC server stops and
//     the socket is removed, as when a plugin pod is deleted) until the content
//     changes; any other content is a generation: a new one restarts the plugin (stop,
//     then register again with a new socket, as a restarted plugin pod does).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{} // closed (and replaced) when devices change
	stop    chan struct{}
}

func (p *plugin) snapshot() ([]*pluginapi.Device, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devices, p.changed
}

func (p *plugin) set(devices []*pluginapi.Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices = devices
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devices, changed := p.snapshot()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-p.stop:
			return nil
		case <-s.Context().Done():
			return nil
		}
	}
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// parseDevices reads "ID=NUMA[:Health],ID=NUMA[:Health],..." (the flag or the file's
// content); Health is Healthy (the default) or Unhealthy.
func parseDevices(spec string) ([]*pluginapi.Device, error) {
	var out []*pluginapi.Device
	for _, part := range strings.FieldsFunc(spec, func(r rune) bool { return r == ',' || r == '\n' || r == ' ' }) {
		id, rest, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("device %q: want ID=NUMA", part)
		}
		numa, health, hasHealth := strings.Cut(rest, ":")
		if !hasHealth {
			health = pluginapi.Healthy
		}
		if health != pluginapi.Healthy && health != pluginapi.Unhealthy {
			return nil, fmt.Errorf("device %q: health %q: want %s or %s", part, health, pluginapi.Healthy, pluginapi.Unhealthy)
		}
		n, err := strconv.ParseInt(numa, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("device %q: NUMA node: %v", part, err)
		}
		out = append(out, &pluginapi.Device{
			ID: id, Health: health,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: n}}},
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func inode(path string) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Ino
}

func same(a, b []*pluginapi.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Health != b[i].Health || a[i].Topology.Nodes[0].ID != b[i].Topology.Nodes[0].ID {
			return false
		}
	}
	return true
}

func healthy(devices []*pluginapi.Device) int {
	n := 0
	for _, d := range devices {
		if d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

func main() {
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name")
	dir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugins directory")
	socket := flag.String("socket", "rollout-lab-gpu.sock", "this plugin's socket name in plugin-dir")
	devs := flag.String("devices", "", "devices as ID=NUMA[:Unhealthy],...")
	devFile := flag.String("devices-file", "", "file with devices as ID=NUMA[:Unhealthy], one a line (instead of -devices); re-read every 0.5 s")
	stateFile := flag.String("state-file", "", "file whose content \"stopped\" stops the plugin and any other new content restarts it")
	flag.Parse()
	read := func() ([]*pluginapi.Device, error) {
		spec := *devs
		if *devFile != "" {
			b, err := os.ReadFile(*devFile)
			if err != nil {
				return nil, err
			}
			spec = string(b)
		}
		return parseDevices(spec)
	}
	state := func() string {
		if *stateFile == "" {
			return ""
		}
		b, err := os.ReadFile(*stateFile)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	devices, err := read()
	if err != nil {
		log.Fatalf("fakedeviceplugin: %v", err)
	}
	kubeletSock := filepath.Join(*dir, "kubelet.sock")
	own := filepath.Join(*dir, *socket)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)

	for {
		// wait for the kubelet's registration socket (and to be started, when stopped)
		for inode(kubeletSock) == 0 || state() == "stopped" {
			select {
			case <-sig:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
		kubeletIno := inode(kubeletSock)
		generation := state()
		if d, err := read(); err == nil {
			devices = d
		} else {
			log.Printf("fakedeviceplugin: devices: %v (keeping the last good list)", err)
		}
		_ = os.Remove(own)
		l, err := net.Listen("unix", own)
		if err != nil {
			log.Printf("fakedeviceplugin: listen %s: %v", own, err)
			time.Sleep(time.Second)
			continue
		}
		p := &plugin{devices: devices, changed: make(chan struct{}), stop: make(chan struct{})}
		srv := grpc.NewServer()
		pluginapi.RegisterDevicePluginServer(srv, p)
		go func() { _ = srv.Serve(l) }()
		if err := register(kubeletSock, *socket, *resource); err != nil {
			log.Printf("fakedeviceplugin: register: %v", err)
		} else {
			log.Printf("fakedeviceplugin: registered %s with %d device(s), %d healthy, on %s", *resource, len(devices), healthy(devices), own)
		}
		// serve until the kubelet restarts (new kubelet.sock), our socket is removed, or
		// the state file stops or restarts the plugin
		why := ""
		for why == "" {
			select {
			case <-sig:
				close(p.stop)
				srv.Stop()
				_ = os.Remove(own)
				return
			case <-time.After(500 * time.Millisecond):
				if d, err := read(); err != nil {
					log.Printf("fakedeviceplugin: devices: %v (keeping the last good list)", err)
				} else if !same(d, devices) {
					devices = d
					p.set(d)
					log.Printf("fakedeviceplugin: %d device(s), %d healthy: sent to the kubelet", len(d), healthy(d))
				}
				switch st := state(); {
				case inode(kubeletSock) != kubeletIno || inode(own) == 0:
					why = "kubelet restarted; registering again"
				case st == "stopped":
					why = "stopped (state file)"
				case st != generation:
					why = "restarting (state file)"
				}
			}
		}
		close(p.stop)
		srv.Stop()
		_ = os.Remove(own)
		log.Printf("fakedeviceplugin: %s", why)
	}
}

func register(kubeletSock, endpoint, resource string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
		Options: &pluginapi.DevicePluginOptions{},
	})
	return err
}
