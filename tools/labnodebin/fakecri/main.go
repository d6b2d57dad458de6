// Command fakecri serves the in-memory CRI runtime and image services of
// k8s.io/cri-client/pkg/fake on a unix socket, so a real kubelet can run in a
// rollout lab node without a container runtime. Sandboxes and containers exist
// only in memory, and no process is started, except for the containers of a
// pod that opts in with the annotation lab.rollout.dev/run-containers: "true"
// (see run.go): their command runs as a process in the node's namespaces.
package main

import (
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

func main() {
	listen := flag.String("listen", "unix:///var/lib/rollout-lab/cri.sock", "CRI endpoint to serve")
	imageSize := flag.Uint64("image-size", 1<<20, "size reported for every image (0 makes the kubelet report ImageInspectError)")
	cgroupDriver := flag.String("cgroup-driver", "cgroupfs", "cgroup driver reported in RuntimeConfig (cgroupfs or systemd)")
	flag.Parse()

	r := fake.NewFakeRemoteRuntime()
	// Pulled images get their id from the image name (the fake's makeFakeImage); the size must be
	// non-zero or the kubelet's image manager treats the image as not inspectable.
	r.ImageService.SetFakeImageSize(*imageSize)
	driver := runtimeapi.CgroupDriver_CGROUPFS
	if *cgroupDriver == "systemd" {
		driver = runtimeapi.CgroupDriver_SYSTEMD
	}
	r.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{CgroupDriver: driver}
	// The fake's own Start registers the fake itself; the runner wraps it (its container methods
	// run opted-in containers) and is what this server registers.
	rt := newRunner(r)
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, rt)
	runtimeapi.RegisterImageServiceServer(server, rt)
	l, err := util.CreateListener(*listen)
	if err != nil {
		log.Fatalf("fakecri: listen on %q: %v", *listen, err)
	}
	// what the fake's Start sets: runtime and network ready
	r.RuntimeService.Lock()
	r.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	r.RuntimeService.Unlock()
	go func() {
		if err := server.Serve(l); err != nil {
			log.Printf("fakecri: serve: %v", err)
		}
	}()
	log.Printf("fakecri: serving the fake runtime and image services on %s", *listen)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	rt.killAll()
	server.Stop()
}
