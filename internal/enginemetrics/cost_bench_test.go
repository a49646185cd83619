package enginemetrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/workers"
)

// serveEnv makes the test binary a fleet of fake vLLM /metrics servers instead of running tests:
// its value is the number of servers. BenchmarkScrape64Workers starts it as a separate process,
// so that the servers' CPU time is not counted as the scraper's.
const serveEnv = "CACHEROUTE_ENGINEMETRICS_SERVE"

func TestMain(m *testing.M) {
	if n, err := strconv.Atoi(os.Getenv(serveEnv)); err == nil && n > 0 {
		serveFleet(n)
		return
	}
	os.Exit(m.Run())
}

// serveFleet serves n loopback /metrics servers, prints their addresses one a line and "ready",
// and exits when its standard input closes (its parent ended).
func serveFleet(n int) {
	whole, err := os.ReadFile("testdata/vllm.txt")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	small := filtered(whole)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := whole
		if len(r.URL.Query()["name[]"]) > 0 {
			p = small
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(p)
	})
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		go func() { _ = http.Serve(ln, h) }()
		fmt.Println("http://" + ln.Addr().String())
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// startFleet re-executes the test binary as a fleet of n metrics servers and returns their URLs.
func startFleet(b *testing.B, n int) []string {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	var urls []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if line == "ready" {
			return urls
		}
		if strings.HasPrefix(line, "error:") {
			b.Fatal(line)
		}
		urls = append(urls, line)
	}
	b.Fatal("the metrics fleet ended before it was ready")
	return nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScrape64Workers runs the real scraper at the default 100 ms interval against 64
// worker URLs served by another process, for a few seconds of wall time, and reports this
// process's CPU time over that wall time in percent of one core (%core), and the scrapes done
// per second. Run it with -benchtime=1x; each iteration is one measurement period.
func BenchmarkScrape64Workers(b *testing.B) {
	if testing.Short() {
		b.Skip("starts 64 servers in a second process and runs for seconds")
	}
	const (
		n        = 64
		interval = 100 * time.Millisecond
		period   = 5 * time.Second
	)
	urls := startFleet(b, n)
	pool := workers.NewPool(workers.Options{LoadSignal: workers.SignalEngine, EngineMaxAge: workers.EngineMaxAge(interval)})
	for _, u := range urls {
		if _, err := pool.Add(u); err != nil {
			b.Fatal(err)
		}
	}
	s := New(pool, Options{Interval: interval}, quiet())
	defer s.Close()
	// Warm up: connections open, buffers pooled.
	s.ScrapeAll(context.Background())
	var pct, rate float64
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), period)
		cpu0, wall0 := cpuTime(), time.Now()
		s.Run(ctx)
		cpu, wall := cpuTime()-cpu0, time.Since(wall0)
		cancel()
		pct += 100 * cpu.Seconds() / wall.Seconds()
		rate += float64(n) / interval.Seconds()
	}
	var errs int64
	for _, w := range pool.All() {
		errs += w.ScrapeErrors() // a round starved of CPU on a busy machine times out
		if _, fresh, ok := w.Engine(); ok && fresh && w.Load() != 15 {
			b.Errorf("%s: load %d, want 15", w.Name(), w.Load())
		}
	}
	b.ReportMetric(float64(errs)/float64(b.N), "errors")
	b.ReportMetric(pct/float64(b.N), "%core")
	b.ReportMetric(rate/float64(b.N), "scrapes/s")
	b.ReportMetric(0, "ns/op")
}
