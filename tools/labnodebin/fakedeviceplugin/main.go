// Command fakedeviceplugin is a kubelet device plugin (API v1beta1) that advertises
// simulated devices, each with its NUMA node, so the kubelet's device manager gives
// real topology hints and writes its real checkpoint in a rollout lab node.
//
// It registers with the kubelet at <plugin-dir>/kubelet.sock and registers again
// whenever the kubelet restarts (the kubelet recreates its socket and removes every
// other socket in the directory when it starts).
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
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	stop    chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-p.stop:
	case <-s.Context().Done():
	}
	return nil
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

// parseDevices reads "ID=NUMA,ID=NUMA,..." (the flag or the file's content).
func parseDevices(spec string) ([]*pluginapi.Device, error) {
	var out []*pluginapi.Device
	for _, part := range strings.FieldsFunc(spec, func(r rune) bool { return r == ',' || r == '\n' || r == ' ' }) {
		id, numa, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("device %q: want ID=NUMA", part)
		}
		n, err := strconv.ParseInt(numa, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("device %q: NUMA node: %v", part, err)
		}
		out = append(out, &pluginapi.Device{
			ID: id, Health: pluginapi.Healthy,
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

func main() {
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name")
	dir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugins directory")
	socket := flag.String("socket", "rollout-lab-gpu.sock", "this plugin's socket name in plugin-dir")
	devs := flag.String("devices", "", "devices as ID=NUMA,ID=NUMA,...")
	devFile := flag.String("devices-file", "", "file with devices as ID=NUMA, one a line (instead of -devices)")
	flag.Parse()
	spec := *devs
	if *devFile != "" {
		b, err := os.ReadFile(*devFile)
		if err != nil {
			log.Fatalf("fakedeviceplugin: %v", err)
		}
		spec = string(b)
	}
	devices, err := parseDevices(spec)
	if err != nil {
		log.Fatalf("fakedeviceplugin: %v", err)
	}
	kubeletSock := filepath.Join(*dir, "kubelet.sock")
	own := filepath.Join(*dir, *socket)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)

	for {
		// wait for the kubelet's registration socket
		for inode(kubeletSock) == 0 {
			select {
			case <-sig:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
		kubeletIno := inode(kubeletSock)
		_ = os.Remove(own)
		l, err := net.Listen("unix", own)
		if err != nil {
			log.Printf("fakedeviceplugin: listen %s: %v", own, err)
			time.Sleep(time.Second)
			continue
		}
		p := &plugin{devices: devices, stop: make(chan struct{})}
		srv := grpc.NewServer()
		pluginapi.RegisterDevicePluginServer(srv, p)
		go func() { _ = srv.Serve(l) }()
		if err := register(kubeletSock, *socket, *resource); err != nil {
			log.Printf("fakedeviceplugin: register: %v", err)
		} else {
			log.Printf("fakedeviceplugin: registered %s with %d device(s) on %s", *resource, len(devices), own)
		}
		// serve until the kubelet restarts (new kubelet.sock) or our socket is removed
		done := false
		for !done {
			select {
			case <-sig:
				close(p.stop)
				srv.Stop()
				_ = os.Remove(own)
				return
			case <-time.After(time.Second):
				done = inode(kubeletSock) != kubeletIno || inode(own) == 0
			}
		}
		close(p.stop)
		srv.Stop()
		log.Printf("fakedeviceplugin: kubelet restarted; registering again")
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
