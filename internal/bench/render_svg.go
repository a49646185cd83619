package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Chart geometry, in SVG user units.
const (
	chartW, chartH   = 960, 440
	panelTop         = 60
	panelH           = 260
	leftX, rightX    = 70, 550
	panelW           = 360
	hitColor         = "#2b8a3e"
	p50Color         = "#1c7ed6"
	p99Color         = "#a5d8ff"
	gridColor        = "#dee2e6"
	textColor        = "#212529"
	chartFontFamily  = "system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif"
	labelRotationDeg = -30
)

// WriteSVG draws the report as two bar charts side by side: prompt-cache hit rate per target,
// and TTFT p50 and p99 per target. The SVG is written by hand; it needs nothing but a browser.
func WriteSVG(w io.Writer, r *Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" fill="%s">`+"\n",
		chartW, chartH, chartW, chartH, chartFontFamily, textColor)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="26" font-size="16" font-weight="bold">%s</text>`+"\n", leftX, esc("cacheroute bench: "+r.Workload))
	fmt.Fprintf(&b, `<text x="%d" y="44" font-size="11">%s</text>`+"\n", leftX, esc(summaryLine(r)))

	n := len(r.Targets)
	names := make([]string, n)
	hits := make([]float64, n)
	p50 := make([]float64, n)
	p99 := make([]float64, n)
	for i, t := range r.Targets {
		names[i], hits[i], p50[i], p99[i] = t.Name, 100*t.HitRate, t.TTFT.P50, t.TTFT.P99
	}

	// Left: hit rate, 0 to 100%.
	axis(&b, leftX, "prompt-cache hit rate", 100, func(v float64) string { return fmt.Sprintf("%.0f%%", v) })
	bars(&b, leftX, names, 100, [][]float64{hits}, []string{hitColor}, func(v float64) string { return fmt.Sprintf("%.0f%%", v) })

	// Right: TTFT p50 and p99.
	top := niceCeil(maxOf(p99))
	axis(&b, rightX, "time to first token", top, millis)
	bars(&b, rightX, names, top, [][]float64{p50, p99}, []string{p50Color, p99Color}, millis)
	legendY := panelTop - 8
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d" font-size="11">p50</text>`+"\n",
		rightX+panelW-90, legendY-9, p50Color, rightX+panelW-76, legendY)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d" font-size="11">p99</text>`+"\n",
		rightX+panelW-45, legendY-9, p99Color, rightX+panelW-31, legendY)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// axis draws a panel's title, horizontal grid lines and value labels from 0 to top.
func axis(b *strings.Builder, x0 int, title string, top float64, label func(float64) string) {
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", x0, panelTop-12, esc(title))
	const ticks = 4
	for i := 0; i <= ticks; i++ {
		v := top * float64(i) / ticks
		y := float64(panelTop+panelH) - float64(panelH)*float64(i)/ticks
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>`+"\n", x0, y, x0+panelW, y, gridColor)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" font-size="10" text-anchor="end">%s</text>`+"\n", x0-6, y+3, esc(label(v)))
	}
}

// bars draws one group of bars per name, one bar per series, with value labels on top and the
// name below, rotated.
func bars(b *strings.Builder, x0 int, names []string, top float64, series [][]float64, colors []string, label func(float64) string) {
	if len(names) == 0 || top <= 0 {
		return
	}
	group := float64(panelW) / float64(len(names))
	barW := math.Min(40, group*0.7/float64(len(series)))
	base := float64(panelTop + panelH)
	for i, name := range names {
		gx := float64(x0) + group*float64(i) + (group-barW*float64(len(series)))/2
		for s, vals := range series {
			v := math.Max(0, vals[i])
			h := float64(panelH) * math.Min(v, top) / top
			x := gx + barW*float64(s)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, base-h, barW-2, h, colors[s])
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="9" text-anchor="middle">%s</text>`+"\n", x+barW/2-1, base-h-3, esc(label(v)))
		}
		cx := float64(x0) + group*(float64(i)+0.5)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="11" text-anchor="end" transform="rotate(%d %.1f %.1f)">%s</text>`+"\n",
			cx, base+16, labelRotationDeg, cx, base+16, esc(name))
	}
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = math.Max(m, x)
	}
	return m
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func esc(s string) string { return html.EscapeString(s) }
