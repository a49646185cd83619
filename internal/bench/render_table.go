package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// tableHeader are the columns of the comparison table (text and Markdown).
var tableHeader = []string{"target", "hit rate", "predicted", "worker hit", "TTFT p50", "TTFT p90", "TTFT p99",
	"E2E p50", "E2E p99", "ITL p50", "ITL p99", "req/s", "out tok/s", "errors", "imbalance peak/mean"}

// chainHeader are the columns added for --api responses-chain, where a turn that reaches
// another worker than its session's previous turn fails.
var chainHeader = []string{"not found", "same worker"}

// columns are the table's columns for r.
func columns(r *Report) []string {
	if r.API == APIResponsesChain {
		return append(slices.Clone(tableHeader), chainHeader...)
	}
	return tableHeader
}

// row is one target's cells, in columns(r) order.
func row(r *Report, t *TargetReport) []string {
	cells := tableRow(t)
	if r.API == APIResponsesChain {
		cells = append(cells, fmt.Sprint(t.ResponseNotFound), optPct(t.SameWorker))
	}
	return cells
}

// optPct is a percentage, or n/a for nil.
func optPct(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return pct(*v)
}

// noPrediction is the predicted cell of a router that predicted no cached token at all: the
// baseline policies, which know nothing of the workers' caches, send a prefix match of 0.
const noPrediction = "—"

// predictedCell is the predicted hit rate: n/a when the router sent no prediction, noPrediction
// when it predicted nothing cached.
func predictedCell(v *float64) string {
	if v != nil && *v == 0 {
		return noPrediction
	}
	return optPct(v)
}

// tableRow is one target's cells, in tableHeader order.
func tableRow(t *TargetReport) []string {
	worker := "n/a"
	if t.WorkerHitRate != nil {
		worker = pct(*t.WorkerHitRate)
	}
	imb := "n/a"
	if t.Imbalance != nil {
		imb = fmt.Sprintf("%.2f / %.2f", t.Imbalance.Peak, t.Imbalance.Mean)
	}
	return []string{t.Name, pct(t.HitRate), predictedCell(t.PredictedHitRate), worker, millis(t.TTFT.P50), millis(t.TTFT.P90), millis(t.TTFT.P99),
		millis(t.E2E.P50), millis(t.E2E.P99), millis(t.ITL.P50), millis(t.ITL.P99), fmt.Sprintf("%.2f", t.RequestsPerSec), fmt.Sprintf("%.0f", t.OutputTokensPerSec),
		fmt.Sprint(t.Errors + t.Skipped), imb}
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

// millis formats a duration given in milliseconds.
func millis(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.1fs", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2fs", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0fms", v)
	default:
		return fmt.Sprintf("%.1fms", v)
	}
}

// summaryLine describes the workload in one line.
func summaryLine(r *Report) string { return "workload " + r.Workload + ": " + runLine(r) }

// runLine describes the run's settings in one line: the sessions, requests, concurrency, API and
// time scale.
func runLine(r *Report) string {
	s := fmt.Sprintf("%d sessions, %d requests per target, concurrency %d", r.Sessions, r.Requests, r.Concurrency)
	if r.API != "" && r.API != APIChat {
		s += "; api " + r.API
	}
	if r.TimeScale > 0 && r.TimeScale != 1 {
		s += fmt.Sprintf("; simulated workers at time scale %g, times shown at full scale", r.TimeScale)
	}
	return s
}

// WriteTable writes the comparison as an aligned text table, followed by each target's decision
// labels and worker shares.
func WriteTable(w io.Writer, r *Report) error {
	fmt.Fprintln(w, summaryLine(r))
	if l := ceilingLine(r); l != "" {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(columns(r), "\t"))
	for i := range r.Targets {
		fmt.Fprintln(tw, strings.Join(row(r, &r.Targets[i]), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for i := range r.Targets {
		t := &r.Targets[i]
		fmt.Fprintf(w, "%s\n  decisions: %s\n  workers:   %s\n", t.Name, decisionList(t), shareList(t))
		if l := routerLine(t); l != "" {
			fmt.Fprintf(w, "  router:    %s\n", l)
		}
		if l := tokenizeLine(t); l != "" {
			fmt.Fprintf(w, "  tokenize:  %s\n", l)
		}
		if t.SameWorker != nil {
			fmt.Fprintf(w, "  sticking:  %s of later turns on the previous turn's worker\n", pct(*t.SameWorker))
		}
		if len(t.PDPaths) > 0 {
			fmt.Fprintf(w, "  p/d:       %s", countList(t.PDPaths))
			if t.PDSkipped != nil {
				fmt.Fprintf(w, "; %s of later turns skipped the transfer on their decode worker", pct(*t.PDSkipped))
			}
			fmt.Fprintln(w)
		}
		for _, l := range pressureLines(t) {
			fmt.Fprintf(w, "  %s\n", l)
		}
		for _, e := range t.ErrorSamples {
			fmt.Fprintf(w, "  error:     %s\n", e)
		}
	}
	if len(r.Fronts) > 0 {
		return writeFrontsTable(w, r)
	}
	return nil
}

// routerLine describes how the bench ran an in-process target's routers: the replicas and
// the router args; "" when there is nothing to say.
func routerLine(t *TargetReport) string {
	var parts []string
	if t.Replicas > 1 {
		parts = append(parts, replicasText(t))
	}
	if len(t.RouterArgs) > 0 {
		parts = append(parts, strings.Join(t.RouterArgs, " "))
	}
	return strings.Join(parts, "; ")
}

// replicasText says how many replicas ran and whether they shared their sessions.
func replicasText(t *TargetReport) string {
	if t.SessionStore == "redis" {
		return fmt.Sprintf("%d replicas sharing sessions through Redis", t.Replicas)
	}
	return fmt.Sprintf("%d replicas, each with its own session map", t.Replicas)
}

// decisionList is "label n (p%), ..." by count, most frequent first.
func decisionList(t *TargetReport) string {
	if len(t.Decisions) == 0 {
		return "n/a (no x-vllm-router-decision header)"
	}
	return countList(t.Decisions)
}

// countList is "key n (p%), ..." by count, most frequent first.
func countList(counts map[string]int) string {
	total := 0
	for _, n := range counts {
		total += n
	}
	keys := slices.Sorted(maps.Keys(counts))
	slices.SortStableFunc(keys, func(a, b string) int { return counts[b] - counts[a] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d (%.0f%%)", k, counts[k], 100*float64(counts[k])/float64(total))
	}
	return strings.Join(parts, ", ")
}

// shareList is "worker p%, ..." in worker order.
func shareList(t *TargetReport) string {
	if len(t.WorkerShare) == 0 {
		return "n/a (no worker header)"
	}
	keys := slices.Sorted(maps.Keys(t.WorkerShare))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.0f%%", shortWorker(k), 100*t.WorkerShare[k])
	}
	return strings.Join(parts, ", ")
}

// shortWorker drops the scheme of a worker URL.
func shortWorker(u string) string {
	u = strings.TrimPrefix(u, "http://")
	return strings.TrimPrefix(u, "https://")
}

// tokenizeLine says how often the target's routers called /tokenize; "" when not counted.
func tokenizeLine(t *TargetReport) string {
	if t.TokenizeCallsPerRequest == nil {
		return ""
	}
	s := fmt.Sprintf("%.2f calls per request", *t.TokenizeCallsPerRequest)
	if t.TokenizeCachedPerRequest != nil {
		s += fmt.Sprintf(", %.2f answered from the token cache (the prompt's or an earlier turn's)", *t.TokenizeCachedPerRequest)
	}
	return s
}
