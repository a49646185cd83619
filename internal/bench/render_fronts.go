package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/cacheroute/cacheroute/internal/metrics"
)

// frontsHeader are the columns of the --fronts table (text and Markdown).
var frontsHeader = []string{"front", "requests", "paired", "added TTFT p50", "added TTFT p90", "added E2E p50", "added E2E p90",
	"CPU per request", "idle CPU", "CPU per request less idle", "÷ HAProxy's (whole / less idle)", "tokenize ok / cached / timeout / error"}

// frontsTitle introduces the --fronts table.
func frontsTitle(r *Report) string {
	s := "what each front adds, paired per request with the same request sent direct (wall clock)"
	if r.PromptBytes != nil {
		s += fmt.Sprintf("; prompts %s mean, %s median, %s largest (messages as JSON)",
			kib(r.PromptBytes.Mean), kib(r.PromptBytes.P50), kib(r.PromptBytes.Max))
	}
	return s
}

// kib formats a size in bytes.
func kib(b float64) string {
	if b >= 1<<20 {
		return fmt.Sprintf("%.2f MiB", b/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", b/(1<<10))
}

// frontRow is one front's cells, in frontsHeader order.
func frontRow(r *Report, f *FrontReport) []string {
	added := func(l *Latency, p50 bool) string {
		switch {
		case l == nil:
			return "—"
		case p50:
			return fmt.Sprintf("%.2fms", l.P50)
		default:
			return fmt.Sprintf("%.2fms", l.P90)
		}
	}
	us := func(v *float64, unit string) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprintf("%.0fµs%s", *v, unit)
	}
	ratio := "—"
	if h := haproxyFor(r, f); h != nil && f.CPUPerRequestUS != nil {
		ratio = fmt.Sprintf("%s / %s", times(f.CPUPerRequestUS, h.CPUPerRequestUS), times(f.NetCPUPerRequestUS, h.NetCPUPerRequestUS))
	}
	tok := "—"
	if f.Tokenize != nil {
		parts := make([]string, 0, len(metrics.TokenizeResults))
		for _, res := range []string{metrics.TokenizeOK, metrics.TokenizeCached, metrics.TokenizeTimeout, metrics.TokenizeError} {
			parts = append(parts, fmt.Sprintf("%.0f", f.Tokenize[res]))
		}
		tok = strings.Join(parts, " / ")
	}
	return []string{f.Name, fmt.Sprintf("%d (%d failed)", f.Requests, f.Errors), fmt.Sprint(f.Paired),
		added(f.AddedTTFT, true), added(f.AddedTTFT, false), added(f.AddedE2E, true), added(f.AddedE2E, false),
		us(f.CPUPerRequestUS, ""), us(f.IdleCPUPerSecUS, "/s"), us(f.NetCPUPerRequestUS, ""), ratio, tok}
}

// times is a ÷ b as a factor, n/a when either is unknown or b is not positive.
func times(a, b *float64) string {
	if a == nil || b == nil || *b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", *a / *b)
}

// haproxyFor is the HAProxy front f's CPU is compared with: the one run with f's session id
// mode, else the first; nil when none ran or none has a CPU figure.
func haproxyFor(r *Report, f *FrontReport) *FrontReport {
	var first *FrontReport
	for i := range r.Fronts {
		h := &r.Fronts[i]
		if h.Front != HAProxyPolicy || h.CPUPerRequestUS == nil {
			continue
		}
		if h.SessionMode == f.SessionMode {
			return h
		}
		if first == nil {
			first = h
		}
	}
	return first
}

// writeFrontsTable writes the --fronts table as aligned text.
func writeFrontsTable(w io.Writer, r *Report) error {
	fmt.Fprintf(w, "\n%s\n\n", frontsTitle(r))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(frontsHeader, "\t"))
	for i := range r.Fronts {
		fmt.Fprintln(tw, strings.Join(frontRow(r, &r.Fronts[i]), "\t"))
	}
	return tw.Flush()
}

// writeFrontsMarkdown writes the --fronts table in Markdown.
func writeFrontsMarkdown(b *strings.Builder, r *Report) {
	fmt.Fprintf(b, "\n%s:\n\n| %s |\n", frontsTitle(r), strings.Join(frontsHeader, " | "))
	b.WriteString("|---" + strings.Repeat("|---:", len(frontsHeader)-1) + "|\n")
	for i := range r.Fronts {
		fmt.Fprintf(b, "| %s |\n", strings.Join(frontRow(r, &r.Fronts[i]), " | "))
	}
}
