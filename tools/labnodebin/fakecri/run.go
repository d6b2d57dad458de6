package main

// Running the command of an opted-in container as a real process.
//
// A pod annotated lab.rollout.dev/run-containers: "true" (the CRI passes the pod's annotations in
// the sandbox config of CreateContainer) gets each container's command run, at StartContainer,
// as a child of fakecri: in the node's namespaces (fakecri runs in them), with the environment
// of the CRI CreateContainer request (the pod's env and the device plugin's Allocate envs, as a
// runtime sets them) plus PATH when the request has none (an image's default), the cpuset the
// kubelet's CPU manager put in the request's Linux resources as ROLLOUT_LAB_CPUSET_CPUS (and
// ROLLOUT_LAB_CPUSET_MEMS): the lab's nodes simulate CPUs the machine does not have, so the
// cpuset is exposed, never applied. Its stdout and stderr go to the container's LogPath in the
// CRI log format, so the kubelet serves them (pods/log); when the process ends, the container is
// EXITED with its exit code. StopContainer and RemoveContainer kill its process group.
//
// The fake runtime service's state (its Containers map) is guarded by its embedded mutex; every
// update here takes that lock and calls none of its methods while holding it.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// RunAnnotation is the pod annotation that makes the lab run its containers' commands.
const RunAnnotation = "lab.rollout.dev/run-containers"

type spec struct {
	argv    []string
	env     []string
	dir     string
	logPath string
}

type runner struct {
	*fake.RemoteRuntime
	mu    sync.Mutex
	specs map[string]*spec
	procs map[string]*exec.Cmd
}

func newRunner(r *fake.RemoteRuntime) *runner {
	return &runner{RemoteRuntime: r, specs: map[string]*spec{}, procs: map[string]*exec.Cmd{}}
}

func (r *runner) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil || req.GetSandboxConfig().GetAnnotations()[RunAnnotation] != "true" {
		return resp, err
	}
	cfg := req.GetConfig()
	argv := append(append([]string{}, cfg.GetCommand()...), cfg.GetArgs()...)
	if len(argv) == 0 {
		return nil, fmt.Errorf("fakecri: container %s: %s needs a command (the image's entrypoint is not known here)", cfg.GetMetadata().GetName(), RunAnnotation)
	}
	env := []string{}
	hasPath := false
	for _, kv := range cfg.GetEnvs() {
		env = append(env, kv.GetKey()+"="+string(kv.GetValue()))
		hasPath = hasPath || kv.GetKey() == "PATH"
	}
	if !hasPath {
		env = append(env, "PATH="+os.Getenv("PATH"))
	}
	res := cfg.GetLinux().GetResources()
	env = append(env,
		"ROLLOUT_LAB_CPUSET_CPUS="+res.GetCpusetCpus(),
		"ROLLOUT_LAB_CPUSET_MEMS="+res.GetCpusetMems(),
		"ROLLOUT_LAB_CONTAINER_ID="+resp.GetContainerId(),
	)
	dir := cfg.GetWorkingDir()
	if dir == "" {
		dir = "/"
	}
	logPath := ""
	if cfg.GetLogPath() != "" {
		logPath = filepath.Join(req.GetSandboxConfig().GetLogDirectory(), cfg.GetLogPath())
	}
	id := resp.GetContainerId()
	r.mu.Lock()
	r.specs[id] = &spec{argv: argv, env: env, dir: dir, logPath: logPath}
	r.mu.Unlock()
	rs := r.RuntimeService
	rs.Lock()
	if c, ok := rs.Containers[id]; ok {
		c.LogPath = logPath // what a runtime reports, and what the kubelet reads pods/log from
	}
	rs.Unlock()
	return resp, nil
}

func (r *runner) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	id := req.GetContainerId()
	r.mu.Lock()
	s := r.specs[id]
	r.mu.Unlock()
	if s == nil {
		return r.RemoteRuntime.StartContainer(ctx, req)
	}
	var out io.Writer = io.Discard
	var logFile *os.File
	if s.logPath != "" {
		f, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err != nil {
			return nil, fmt.Errorf("fakecri: open log %s: %w", s.logPath, err)
		}
		logFile, out = f, f
	}
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Env, cmd.Dir = s.env, s.dir
	// its own process group (killed as one); killed with fakecri too (no process outlives the node)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err == nil {
		var stderr io.ReadCloser
		stderr, err = cmd.StderrPipe()
		if err == nil {
			err = cmd.Start()
			if err == nil {
				w := &criLog{out: out}
				var copied sync.WaitGroup
				copied.Add(2)
				go w.copy("stdout", stdout, &copied)
				go w.copy("stderr", stderr, &copied)
				r.mu.Lock()
				r.procs[id] = cmd
				r.mu.Unlock()
				if _, err := r.RemoteRuntime.StartContainer(ctx, req); err != nil {
					_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				}
				go r.wait(id, cmd, &copied, logFile)
				return &runtimeapi.StartContainerResponse{}, nil
			}
		}
	}
	if logFile != nil {
		_ = logFile.Close()
	}
	return nil, fmt.Errorf("fakecri: start %q: %w", strings.Join(s.argv, " "), err)
}

// wait records the process's end: the container EXITED with its exit code.
func (r *runner) wait(id string, cmd *exec.Cmd, copied *sync.WaitGroup, logFile *os.File) {
	copied.Wait() // the pipes drained (Wait closes them)
	err := cmd.Wait()
	if logFile != nil {
		_ = logFile.Close()
	}
	code := int32(0)
	reason := "Completed"
	if err != nil {
		reason = "Error"
		code = 128
		if ee, ok := err.(*exec.ExitError); ok {
			if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
				code = 128 + int32(st.Signal())
			} else {
				code = int32(ee.ExitCode())
			}
		}
	}
	r.mu.Lock()
	delete(r.procs, id)
	r.mu.Unlock()
	rs := r.RuntimeService
	rs.Lock()
	if c, ok := rs.Containers[id]; ok {
		c.State = runtimeapi.ContainerState_CONTAINER_EXITED
		if c.FinishedAt == 0 {
			c.FinishedAt = time.Now().UnixNano()
		}
		c.ExitCode, c.Reason = code, reason
	}
	rs.Unlock()
	log.Printf("fakecri: container %s exited %d", id, code)
}

func (r *runner) kill(id string) {
	r.mu.Lock()
	cmd := r.procs[id]
	r.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (r *runner) killAll() {
	r.mu.Lock()
	ids := make([]string, 0, len(r.procs))
	for id := range r.procs {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	for _, id := range ids {
		r.kill(id)
	}
}

func (r *runner) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	r.kill(req.GetContainerId())
	return r.RemoteRuntime.StopContainer(ctx, req)
}

func (r *runner) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	id := req.GetContainerId()
	r.kill(id)
	r.mu.Lock()
	delete(r.specs, id)
	r.mu.Unlock()
	return r.RemoteRuntime.RemoveContainer(ctx, req)
}

// criLog writes lines in the CRI log format the kubelet reads:
// "<RFC3339Nano time> <stream> <F|P> <text>\n" (P: a partial line, continued by the next).
type criLog struct {
	mu  sync.Mutex
	out io.Writer
}

func (w *criLog) copy(stream string, in io.Reader, done *sync.WaitGroup) {
	defer done.Done()
	br := bufio.NewReaderSize(in, 16*1024)
	for {
		line, isPrefix, err := br.ReadLine()
		if len(line) > 0 || (err == nil && !isPrefix) {
			tag := "F"
			if isPrefix {
				tag = "P"
			}
			w.mu.Lock()
			_, _ = fmt.Fprintf(w.out, "%s %s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), stream, tag, line)
			w.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}
