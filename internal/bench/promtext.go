package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Worker metric names (vLLM's).
const (
	metricPrefixHits    = "vllm:prefix_cache_hits_total"
	metricPrefixQueries = "vllm:prefix_cache_queries_total"
	metricRunning       = "vllm:num_requests_running"
	metricWaiting       = "vllm:num_requests_waiting"
	metricPreemptions   = "vllm:num_preemptions_total"
)

// sumMetrics reads Prometheus text exposition from r and returns, for each name asked for, the
// sum of its samples over all label sets. Names not found are absent from the result.
func sumMetrics(r io.Reader, names ...string) (map[string]float64, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	err := eachSample(r, func(name string) bool { return want[name] }, func(name, _ string, v float64) {
		out[name] += v
	})
	return out, err
}

// eachSample reads Prometheus text exposition from r and calls f with the metric name, the label
// set (what stands between the braces, "" without) and the value of every sample whose name want
// takes; a value that is no number is an error.
func eachSample(r io.Reader, want func(name string) bool, f func(name, labels string, v float64)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if !want(name) {
			continue
		}
		labels := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return fmt.Errorf("metric %s: bad value %q", name, fields[0])
		}
		f(name, labels, v)
	}
	return sc.Err()
}

// scrape fetches base/metrics and sums the named metrics.
func scrape(ctx context.Context, client *http.Client, base string, names ...string) (map[string]float64, error) {
	return scrapeWith(ctx, client, base, func(r io.Reader) (map[string]float64, error) { return sumMetrics(r, names...) })
}

// scrapeWith fetches base/metrics and reads it with read.
func scrapeWith(ctx context.Context, client *http.Client, base string, read func(io.Reader) (map[string]float64, error)) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: HTTP %d", base, resp.StatusCode)
	}
	return read(io.LimitReader(resp.Body, 16<<20))
}

// workerCounters are counters summed over workers.
type workerCounters struct {
	hits, queries float64
	// preemptions is vllm:num_preemptions_total, when every worker exports it (hasPreemptions).
	preemptions    float64
	hasPreemptions bool
}

// cacheCounters sums prefix-cache hits and queries, and preemptions, over the workers at urls.
func cacheCounters(ctx context.Context, client *http.Client, urls []string) (workerCounters, error) {
	c := workerCounters{hasPreemptions: true}
	for _, u := range urls {
		m, err := scrape(ctx, client, u, metricPrefixHits, metricPrefixQueries, metricPreemptions)
		if err != nil {
			return c, err
		}
		if _, ok := m[metricPrefixQueries]; !ok {
			return c, fmt.Errorf("%s/metrics has no %s", u, metricPrefixQueries)
		}
		c.hits += m[metricPrefixHits]
		c.queries += m[metricPrefixQueries]
		p, ok := m[metricPreemptions]
		c.preemptions += p
		c.hasPreemptions = c.hasPreemptions && ok
	}
	return c, nil
}

// scrapedLoads returns a load source that reads running + waiting requests from every worker's
// /metrics; a sample is dropped when any worker does not answer.
func scrapedLoads(client *http.Client, urls []string) func() []float64 {
	return func() []float64 {
		out := make([]float64, len(urls))
		for i, u := range urls {
			m, err := scrape(context.Background(), client, u, metricRunning, metricWaiting)
			if err != nil {
				return nil
			}
			out[i] = m[metricRunning] + m[metricWaiting]
		}
		return out
	}
}

// sumByLabel reads Prometheus text exposition from r and returns the samples of metric name
// summed by the value of label (samples without it are left out).
func sumByLabel(r io.Reader, name, label string) (map[string]float64, error) {
	out := map[string]float64{}
	err := eachSample(r, func(n string) bool { return n == name }, func(_, labels string, v float64) {
		value := ""
		for _, kv := range strings.Split(labels, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == label {
				value = strings.Trim(strings.TrimSpace(v), `"`)
			}
		}
		if value != "" {
			out[value] += v
		}
	})
	return out, err
}
