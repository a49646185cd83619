package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteMarkdown writes the comparison as a Markdown table, followed by a list of each target's
// decision labels and worker shares.
func WriteMarkdown(w io.Writer, r *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", summaryLine(r))
	cols := columns(r)
	fmt.Fprintf(&b, "| %s |\n", strings.Join(cols, " | "))
	b.WriteString("|---" + strings.Repeat("|---:", len(cols)-1) + "|\n")
	for i := range r.Targets {
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row(r, &r.Targets[i]), " | "))
	}
	b.WriteString("\n")
	for i := range r.Targets {
		t := &r.Targets[i]
		fmt.Fprintf(&b, "- `%s`: decisions %s; workers %s", t.Name, decisionList(t), shareList(t))
		if t.Replicas > 1 {
			fmt.Fprintf(&b, "; %s", replicasText(t))
		}
		if len(t.RouterArgs) > 0 {
			fmt.Fprintf(&b, "; router args `%s`", strings.Join(t.RouterArgs, " "))
		}
		if l := tokenizeLine(t); l != "" {
			fmt.Fprintf(&b, "; tokenize %s", l)
		}
		if t.SameWorker != nil {
			fmt.Fprintf(&b, "; %s of later turns on the previous turn's worker", pct(*t.SameWorker))
		}
		b.WriteString("\n")
	}
	if len(r.Fronts) > 0 {
		writeFrontsMarkdown(&b, r)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
