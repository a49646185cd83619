package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/cacheroute/cacheroute/internal/browsertest"
)

// demoLikeReport is a report shaped like the demo's: four policies, two of them with hit rates
// that round to the same whole percent, TTFTs from about a hundred milliseconds to three seconds.
func demoLikeReport() *Report {
	target := func(name string, hit, p50, p99 float64) TargetReport {
		return TargetReport{Name: name, HitRate: hit, TTFT: Latency{P50: p50, P90: p99 * 0.8, P99: p99}}
	}
	return &Report{Workload: "agent", API: APIChat, Sessions: 32, Requests: 320, Concurrency: 10, TimeScale: 0.1, Targets: []TargetReport{
		target("round_robin", 0.518, 262, 1160), target("consistent_hash", 0.776, 119, 1158),
		target("cache_aware:none", 0.8662, 657, 3020), target("cache_aware", 0.8618, 145, 1050),
	}}
}

func chartOf(t *testing.T, r *Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := WriteSVG(&b, r); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestChartTitleNamesTheWorkload(t *testing.T) {
	svg := chartOf(t, demoLikeReport())
	if !strings.Contains(svg, ">Agent workload: prompt-cache hit rate and time to first token<") || strings.Contains(svg, "bench: agent") {
		t.Errorf("title:\n%s", svg)
	}
	if !strings.Contains(svg, ">32 sessions, 320 requests per target, concurrency 10; simulated workers at time scale 0.1, times shown at full scale<") {
		t.Errorf("subtitle:\n%s", svg)
	}
}

// Hit rates that differ are printed so that they differ: 86.6% and 86.2%, not 87% twice.
func TestChartHitRatesThatDifferReadDifferently(t *testing.T) {
	svg := chartOf(t, demoLikeReport())
	for _, want := range []string{">86.6%<", ">86.2%<", ">51.8%<", ">77.6%<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the chart lacks the label %s", want)
		}
	}
	// Closer still: a second decimal.
	r := demoLikeReport()
	r.Targets[2].HitRate, r.Targets[3].HitRate = 0.86212, 0.86249
	svg = chartOf(t, r)
	if !strings.Contains(svg, ">86.21%<") || !strings.Contains(svg, ">86.25%<") {
		t.Errorf("rates 86.212%% and 86.249%% not told apart:\n%s", svg)
	}
}

// Every label of a time axis is in one unit: seconds for an axis past a second, milliseconds
// below, with the same decimals on every tick.
func TestChartTimeAxisHasOneUnit(t *testing.T) {
	tickLabels := func(svg string) []string {
		// The right panel's axis labels are the text-anchor="end" labels left of it.
		re := regexp.MustCompile(fmt.Sprintf(`<text x="%d" y="[0-9.]+" font-size="10" text-anchor="end">([^<]*)</text>`, rightX-6))
		var out []string
		for _, m := range re.FindAllStringSubmatch(svg, -1) {
			out = append(out, m[1])
		}
		return out
	}
	cases := []struct {
		p99  float64
		want []string
	}{
		{3020, []string{"0s", "1s", "2s", "3s", "4s"}},
		{1160, []string{"0.0s", "0.5s", "1.0s", "1.5s"}},
		{657, []string{"0ms", "200ms", "400ms", "600ms", "800ms"}},
		{8, []string{"0ms", "2ms", "4ms", "6ms", "8ms"}},
		{9, []string{"0.0ms", "2.5ms", "5.0ms", "7.5ms", "10.0ms"}},
	}
	for _, c := range cases {
		r := demoLikeReport()
		for i := range r.Targets {
			r.Targets[i].TTFT = Latency{P50: c.p99 / 4, P99: c.p99 * float64(i+1) / 4}
		}
		got := tickLabels(chartOf(t, r))
		if strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("p99 up to %v ms: ticks %q, want %q", c.p99, got, c.want)
		}
	}
}

// The chart, opened in a real browser: no text is drawn over another, nothing falls outside the
// image, and the image ends just below its lowest text (no empty strip).
func TestChartInBrowserHasNoOverlapNoCutAndNoEmptyStrip(t *testing.T) {
	exe := browsertest.Path(t)
	path := filepath.Join(t.TempDir(), "chart.svg")
	if err := os.WriteFile(path, []byte(chartOf(t, demoLikeReport())), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := browsertest.New(t, exe, 1280, 900)
	if err := chromedp.Do(ctx, chromedp.Navigate("file://"+path)); err != nil {
		t.Fatal(err)
	}
	// Each text is the box its glyphs take, rotated with it (a name under the bars is drawn at an
	// angle): its four corners on the screen. Two boxes overlap when no side of either separates
	// them (the separating axis test).
	problems, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
		const svg = document.documentElement, box = svg.getBoundingClientRect(), out = [];
		const corners = e => {
			const b = e.getBBox(), m = e.getScreenCTM();
			return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
				.map(([x, y]) => new DOMPoint(x, y).matrixTransform(m));
		};
		const separated = (p, q) => [p, q].some(poly => poly.some((a, i) => {
			const b = poly[(i + 1) % 4], nx = b.y - a.y, ny = a.x - b.x;
			const proj = pts => pts.map(c => c.x * nx + c.y * ny);
			const [pp, qq] = [proj(p), proj(q)];
			return Math.max(...pp) <= Math.min(...qq) + 0.5 || Math.max(...qq) <= Math.min(...pp) + 0.5;
		}));
		const texts = Array.from(svg.querySelectorAll("text")).map(e => ({text: e.textContent, c: corners(e), r: e.getBoundingClientRect()}));
		let lowest = 0;
		for (const e of svg.querySelectorAll("text, rect:not(:first-child), line")) lowest = Math.max(lowest, e.getBoundingClientRect().bottom);
		texts.forEach((a, i) => {
			if (a.r.left < box.left || a.r.right > box.right || a.r.top < box.top || a.r.bottom > box.bottom) out.push("cut off: " + a.text);
			texts.slice(i + 1).forEach(b => {
				if (!separated(a.c, b.c)) out.push("overlap: " + JSON.stringify(a.text) + " and " + JSON.stringify(b.text));
			});
		});
		if (box.bottom - lowest > 24) out.push("empty strip of " + Math.round(box.bottom - lowest) + " px at the bottom");
		return out;
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}
