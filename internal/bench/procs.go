package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cacheroute/cacheroute/internal/freeport"
)

// procs.go runs the fronts of a --fronts comparison that are processes of their own (a cacheroute
// router started from the bench's own binary, nginx) and reads what a process costs from /proc.

// clockTicks is the unit of utime and stime in /proc/PID/stat (USER_HZ): 100 per second on every
// Linux the bench runs on (sysconf(_SC_CLK_TCK), which Go cannot ask without cgo).
const clockTicks = 100

// cpuTimes is the CPU time of one process: user plus system time from /proc/PID/stat (all its
// threads, exited ones included, in clock ticks of 10 ms), and the run time its live threads
// have had on a CPU from /proc/PID/task/*/schedstat (nanoseconds; threads that exited are not
// counted).
type cpuTimes struct {
	stat      time.Duration
	schedstat time.Duration
	hasSched  bool
}

// readCPU reads the CPU times of process pid.
func readCPU(pid int) (cpuTimes, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return cpuTimes{}, err
	}
	// The command name, field 2, is in parentheses and may hold spaces: fields count from after it.
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return cpuTimes{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[end+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return cpuTimes{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return cpuTimes{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	out := cpuTimes{stat: time.Duration(utime+stime) * time.Second / clockTicks}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return out, nil
	}
	var run int64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			return out, nil // a thread ended between the listing and the read: no exact figure
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return out, nil
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return out, nil
		}
		run += ns
	}
	out.schedstat, out.hasSched = time.Duration(run), true
	return out, nil
}

// cpuSnapshot is the CPU times of a front's processes at one moment, by process id.
type cpuSnapshot map[int]cpuTimes

// snapshotCPU reads the CPU times of every process of pids.
func snapshotCPU(pids []int) (cpuSnapshot, error) {
	out := cpuSnapshot{}
	for _, pid := range pids {
		t, err := readCPU(pid)
		if err != nil {
			return nil, err
		}
		out[pid] = t
	}
	return out, nil
}

// cpuUsed is the CPU time the processes used between before and after: processes that appeared
// since count from zero. exact is the schedstat sum, when every process had one at both moments.
func cpuUsed(before, after cpuSnapshot) (stat, exact time.Duration, hasExact bool) {
	hasExact = true
	for pid, a := range after {
		b := before[pid] // zero for a process started since
		stat += a.stat - b.stat
		exact += a.schedstat - b.schedstat
		if _, seen := before[pid]; !a.hasSched || (seen && !b.hasSched) {
			hasExact = false
		}
	}
	return stat, exact, hasExact
}

// childPIDs are the processes whose parent is pid (nginx's workers under its master).
func childPIDs(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		end := bytes.LastIndexByte(b, ')')
		if end < 0 {
			continue
		}
		f := strings.Fields(string(b[end+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		if child, err := strconv.Atoi(filepath.Base(filepath.Dir(s))); err == nil {
			out = append(out, child)
		}
	}
	return out
}

// frontProcess is a front running as a process of its own on a loopback port.
type frontProcess struct {
	name   string
	url    string
	dir    string // removed on stop; "" for none
	cmd    *exec.Cmd
	out    *boundedBuffer
	exited chan struct{}
	// pids lists the processes whose CPU is the front's: the process, and for nginx its workers.
	pids func() []int
}

// processStartWait bounds how long a front process may take to answer.
const processStartWait = 20 * time.Second

// startProcess runs cmd and waits until ready reports true, or the process exits, or
// processStartWait passes.
func startProcess(name, url, dir string, cmd *exec.Cmd, ready func() bool) (*frontProcess, error) {
	p := &frontProcess{name: name, url: url, dir: dir, cmd: cmd, out: &boundedBuffer{max: 64 << 10}, exited: make(chan struct{})}
	p.pids = func() []int { return []int{cmd.Process.Pid} }
	cmd.Stdout, cmd.Stderr = p.out, p.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		if dir != "" {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	deadline := time.Now().Add(processStartWait)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			p.stop()
			return nil, fmt.Errorf("%s exited: %s", name, strings.TrimSpace(p.out.String()))
		default:
		}
		if ready() {
			return p, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.stop()
	return nil, fmt.Errorf("%s did not answer within %v: %s", name, processStartWait, strings.TrimSpace(p.out.String()))
}

// stop asks the process to end (SIGTERM), kills it after 10 s, and removes its directory.
func (p *frontProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
}

// boundedBuffer keeps the first max bytes written to it: the start of a process's output is
// what explains a failure.
type boundedBuffer struct {
	mu  sync.Mutex
	b   bytes.Buffer
	max int
}

func (w *boundedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.max - w.b.Len(); room > 0 {
		w.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (w *boundedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// processAddr is a free loopback address for a listener another process opens.
func processAddr(ps *ports) (string, error) {
	if ps != nil {
		a, err := ps.addrs(1)
		if err != nil {
			return "", err
		}
		return a[0], nil
	}
	port, err := freeport.Port()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// probeClient asks whether a front process is ready: one connection per probe, none kept open
// to the front afterwards, no proxy from the environment.
var probeClient = &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// answers reports whether GET url answers 200 within a second.
func answers(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startRouterProcess runs a cacheroute router as a process of its own: command (the bench's own
// binary, or what a test gives) with the router's flags, listening on a free loopback port, in
// front of worker with policy, args appended last. It returns once /readiness answers 200.
func startRouterProcess(command []string, name, worker, policy, events string, args []string, ps *ports) (*frontProcess, error) {
	if len(command) == 0 {
		return nil, fmt.Errorf("%s: no command to start a router with", name)
	}
	addr, err := processAddr(ps)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	host, port, _ := net.SplitHostPort(addr)
	argv := append([]string{}, command[1:]...)
	argv = append(argv, "--host", host, "--port", port, "--prometheus-port", "0", "--worker-urls", worker,
		"--policy", policy, "--log-level", "error", "--shutdown-grace-secs", "5")
	if events != "" {
		argv = append(argv, "--kv-events-worker-endpoints", worker+"="+events)
	}
	argv = append(argv, args...)
	url := "http://" + addr
	return startProcess(name, url, "", exec.Command(command[0], argv...), func() bool { return answers(url + "/readiness") })
}

// startNginx runs nginx (from PATH) on a free loopback port in front of worker: one upstream with
// kept-alive connections, nothing buffered either way (a streamed answer goes out token by token,
// a request body to the worker as it comes), bodies up to 64 MiB held in memory. Its CPU is the
// master's and its workers'.
func startNginx(name, worker string, timeout time.Duration, ps *ports) (*frontProcess, error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return nil, fmt.Errorf("%s: nginx not found in PATH (install it, e.g. apt-get install nginx): %w", name, err)
	}
	addr, err := processAddr(ps)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	upstream := strings.TrimPrefix(worker, "http://")
	dir, err := os.MkdirTemp("", "cacheroute-nginx-")
	if err != nil {
		return nil, err
	}
	// Run as root, nginx's workers become nobody: they must reach the directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	secs := max(1, int(timeout.Seconds()))
	conf := fmt.Sprintf(`daemon off; master_process on; worker_processes auto; pid %[1]s/nginx.pid; error_log stderr error;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path %[1]s/body; proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi; uwsgi_temp_path %[1]s/uwsgi; scgi_temp_path %[1]s/scgi;
  client_max_body_size 64m; client_body_buffer_size 64m;
  upstream worker { server %[2]s; keepalive 32; }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://worker; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; proxy_request_buffering off;
      proxy_read_timeout %[4]ds; proxy_send_timeout %[4]ds;
    }
  }
}
`, dir, upstream, addr, secs)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	url := "http://" + addr
	p, err := startProcess(name, url, dir, exec.Command(bin, "-e", "stderr", "-p", dir, "-c", path), func() bool { return answers(url + "/health") })
	if err != nil {
		return nil, err
	}
	master := p.cmd.Process.Pid
	p.pids = func() []int { return append([]int{master}, childPIDs(master)...) }
	return p, nil
}
