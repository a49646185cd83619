package enginemetrics

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cacheroute/cacheroute/internal/workers"
)

func page(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// filtered keeps only the wanted families of a page, as a worker that honours name[] sends it.
func filtered(p []byte) []byte {
	var out []byte
	for line := range bytes.Lines(p) {
		for _, n := range Names {
			if bytes.HasPrefix(line, []byte(n+"{")) || bytes.HasPrefix(line, []byte(n+" ")) ||
				bytes.HasPrefix(line, []byte("# HELP "+n+" ")) || bytes.HasPrefix(line, []byte("# TYPE "+n+" ")) {
				out = append(out, line...)
			}
		}
	}
	return out
}

func TestParseReadsVLLMSummedOverEngines(t *testing.T) {
	for _, p := range [][]byte{page(t, "vllm.txt"), filtered(page(t, "vllm.txt"))} {
		st, ok := Parse(p)
		want := workers.EngineStats{Running: 12, Waiting: 3, KVCacheUsage: 0.5, HasKVCacheUsage: true, KVCapacityTokens: 27000 * 16}
		if !ok || st != want {
			t.Fatalf("Parse = %+v, %v; want %+v (running and waiting summed over engines, usage averaged, capacity from cache_config_info)", st, ok, want)
		}
	}
}

func TestParseReadsOlderVLLMGPUCacheUsage(t *testing.T) {
	st, ok := Parse(page(t, "vllm_old.txt"))
	want := workers.EngineStats{Running: 2, Waiting: 1, KVCacheUsage: 0.25, HasKVCacheUsage: true}
	if !ok || st != want {
		t.Fatalf("Parse = %+v, %v; want %+v", st, ok, want)
	}
}

func TestParseReadsSGLang(t *testing.T) {
	st, ok := Parse(page(t, "sglang.txt"))
	want := workers.EngineStats{Running: 11, Waiting: 4, KVCacheUsage: 0.41, HasKVCacheUsage: true, KVCapacityTokens: 161721}
	if !ok || st != want {
		t.Fatalf("Parse = %+v, %v; want %+v", st, ok, want)
	}
}

func TestParseReadsTheKVCapacityFromTheCacheConfigLabels(t *testing.T) {
	for _, c := range []struct {
		labels string
		want   float64
	}{
		{`{num_gpu_blocks="100",block_size="16"}`, 1600},
		{`{block_size="32", num_gpu_blocks="10",cache_dtype="a\"}b"}`, 320},
		{`{swap_space="4",name="x=\"num_gpu_blocks\"",num_gpu_blocks="8",block_size="16"}`, 128},
		{`{num_gpu_blocks="None",block_size="16"}`, 0}, // before the engine profiled its memory
		{`{block_size="16"}`, 0},
		{`{num_gpu_blocks="-5",block_size="16"}`, 0},
	} {
		st, _ := Parse([]byte("vllm:cache_config_info" + c.labels + " 1.0\n"))
		if st.KVCapacityTokens != c.want {
			t.Errorf("labels %s: capacity %v, want %v", c.labels, st.KVCapacityTokens, c.want)
		}
	}
}

func TestParseSumsSeveralModelsOnOneWorker(t *testing.T) {
	p := "vllm:num_requests_running{model_name=\"a\"} 2\nvllm:num_requests_running{model_name=\"b\"} 3 1733000000000\n" +
		"vllm:num_requests_waiting{model_name=\"a\"} 1\n"
	st, ok := Parse([]byte(p))
	if !ok || st.Running != 5 || st.Waiting != 1 || st.HasKVCacheUsage {
		t.Fatalf("Parse = %+v, %v; want running 5 (with a timestamp on one line), waiting 1, no usage", st, ok)
	}
}

func TestParseWithoutLoadMetricsIsNotOK(t *testing.T) {
	for _, p := range []string{"", "# EOF\n", "process_open_fds 12\nvllm:prompt_tokens_total 4\n", "vllm:kv_cache_usage_perc 0.5\n"} {
		if st, ok := Parse([]byte(p)); ok {
			t.Errorf("Parse(%q) = %+v, ok; want not ok", p, st)
		}
	}
}

func TestParseSkipsMalformedAndNonFiniteSamples(t *testing.T) {
	p := strings.Join([]string{
		`vllm:num_requests_running{model_name="a}b",x="q\"}"} 2`, // braces and escaped quotes in values
		`vllm:num_requests_running{model_name="open 5`,           // label set never ends
		`vllm:num_requests_running NaN`,
		`vllm:num_requests_running +Inf`,
		`vllm:num_requests_running`,
		`vllm:num_requests_runningx 7`,
		`vllm:num_requests_running 1e1`,
		"vllm:num_requests_waiting\t4\r",
		`  sglang:num_queue_reqs 1`,
	}, "\n")
	st, ok := Parse([]byte(p))
	if !ok || st.Running != 12 || st.Waiting != 5 {
		t.Fatalf("Parse = %+v, %v; want running 2+10, waiting 4+1", st, ok)
	}
}

// expfmtStats reads the same figures with the reference parser; ok false when it rejects the page.
func expfmtStats(p []byte) (workers.EngineStats, bool, bool) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(p))
	if err != nil {
		return workers.EngineStats{}, false, false
	}
	var st workers.EngineStats
	found, kv := false, 0
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var v float64
			switch {
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Untyped != nil:
				v = m.GetUntyped().GetValue()
			default:
				continue
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			switch kindOf([]byte(name)) {
			case running:
				st.Running += v
				found = true
			case waiting:
				st.Waiting += v
				found = true
			case kvUsage:
				st.KVCacheUsage += v
				kv++
			}
		}
	}
	if kv > 0 {
		st.KVCacheUsage /= float64(kv)
		st.HasKVCacheUsage = true
	}
	return st, found, true
}

func TestParseAgreesWithExpfmt(t *testing.T) {
	for _, name := range []string{"vllm.txt", "vllm_old.txt", "sglang.txt"} {
		for _, p := range [][]byte{page(t, name), filtered(page(t, name))} {
			want, wantOK, parsed := expfmtStats(p)
			if !parsed {
				t.Fatalf("%s: expfmt rejects the page", name)
			}
			got, ok := Parse(p)
			if !same(got, want) || ok != wantOK {
				t.Errorf("%s: Parse = %+v %v, expfmt %+v %v", name, got, ok, want, wantOK)
			}
		}
	}
}

func same(a, b workers.EngineStats) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) <= 1e-9*math.Max(1, math.Abs(x)+math.Abs(y)) }
	return near(a.Running, b.Running) && near(a.Waiting, b.Waiting) && near(a.KVCacheUsage, b.KVCacheUsage) &&
		a.HasKVCacheUsage == b.HasKVCacheUsage
}

// FuzzParse: Parse never panics, returns finite figures, and on every page the reference parser
// accepts (and which names no metric in the quoted UTF-8 form) agrees with it.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm.txt", "vllm_old.txt", "sglang.txt"} {
		f.Add(page(f, name))
	}
	f.Add([]byte("vllm:num_requests_running{a=\"}\"} 3\n"))
	f.Fuzz(func(t *testing.T, p []byte) {
		got, ok := Parse(p)
		for _, v := range []float64{got.Running, got.Waiting, got.KVCacheUsage} {
			if math.IsNaN(v) {
				t.Fatalf("Parse = %+v: not a number", got)
			}
		}
		if !ok && (got.Running != 0 || got.Waiting != 0) {
			t.Fatalf("Parse = %+v, not ok", got)
		}
		if bytes.Contains(p, []byte(`{"`)) || bytes.Contains(p, []byte("\r")) {
			return
		}
		want, wantOK, parsed := expfmtStats(p)
		if !parsed {
			return
		}
		if math.IsInf(want.Running+want.Waiting+want.KVCacheUsage, 0) {
			return // sums that overflow
		}
		if !same(got, want) || ok != wantOK {
			t.Fatalf("Parse = %+v %v, expfmt %+v %v", got, ok, want, wantOK)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	for _, c := range []struct {
		name string
		page []byte
	}{
		{"filtered", filtered(page(b, "vllm.txt"))},
		{"whole_page", page(b, "vllm.txt")},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.page)))
			for b.Loop() {
				if _, ok := Parse(c.page); !ok {
					b.Fatal("not ok")
				}
			}
		})
		b.Run(c.name+"/expfmt", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.page)))
			for b.Loop() {
				if _, ok, _ := expfmtStats(c.page); !ok {
					b.Fatal("not ok")
				}
			}
		})
	}
}
