// Command fakecri serves the in-memory CRI runtime and image services of
// k8s.io/cri-client/pkg/fake on a unix socket, so a real kubelet can run in a
// rollout lab node without a container runtime. No process is ever started:
// sandboxes and containers exist only in memory.
package main

import (
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
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
	if err := r.Start(*listen); err != nil {
		log.Fatalf("fakecri: %v", err)
	}
	log.Printf("fakecri: serving the fake runtime and image services on %s", *listen)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	r.Stop()
}
