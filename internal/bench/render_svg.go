package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Chart geometry, in SVG user units. The chart is laid out in rows, top to bottom: the title,
// the subtitle (the run's settings), the panels' titles, their legends, the panels, and the
// targets' names under them; each row has its own band, so no text is drawn over another.
const (
	chartW           = 960
	titleY           = 28  // baseline of the title
	subtitleY        = 48  // baseline of the subtitle
	panelTitleY      = 80  // baseline of the panels' titles
	legendY          = 100 // baseline of the panels' legends
	panelTop         = 118 // top of the plotting area (the top grid line)
	panelH           = 240
	leftX, rightX    = 70, 550
	panelW           = 360
	nameGap          = 14  // from the plotting area's bottom to the first name's baseline
	bottomMargin     = 16  // below the lowest name
	nameCharW        = 6.2 // average advance of a character of an 11-unit name, for the height
	hitColor         = "#2b8a3e"
	p50Color         = "#1c7ed6"
	p99Color         = "#a5d8ff"
	gridColor        = "#dee2e6"
	textColor        = "#212529"
	mutedColor       = "#495057"
	chartFontFamily  = "system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif"
	labelRotationDeg = -30
)

// WriteSVG draws the report as two bar charts side by side: prompt-cache hit rate per target,
// and TTFT p50 and p99 per target. The SVG is written by hand; it needs nothing but a browser.
func WriteSVG(w io.Writer, r *Report) error {
	n := len(r.Targets)
	names := make([]string, n)
	hits := make([]float64, n)
	p50 := make([]float64, n)
	p99 := make([]float64, n)
	longest := 0
	for i, t := range r.Targets {
		names[i], hits[i], p50[i], p99[i] = t.Name, 100*t.HitRate, t.TTFT.P50, t.TTFT.P99
		longest = max(longest, utf8.RuneCountInString(t.Name))
	}
	// The chart ends just below the longest name, rotated.
	height := panelTop + panelH + nameGap + int(math.Ceil(float64(longest)*nameCharW*math.Sin(-labelRotationDeg*math.Pi/180))) + bottomMargin

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s" fill="%s">`+"\n",
		chartW, height, chartW, height, chartFontFamily, textColor)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, height)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="17" font-weight="bold">%s</text>`+"\n", leftX, titleY, esc(chartTitle(r)))
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="12" fill="%s">%s</text>`+"\n", leftX, subtitleY, mutedColor, esc(runLine(r)))

	// Left: hit rate, 0 to 100%, with as many decimals as it takes to tell different rates apart.
	hitLabel := percentFormat(hits)
	panelTitle(&b, leftX, "prompt-cache hit rate")
	legend(&b, leftX, []string{"share of prompt tokens served from the workers' prefix caches"}, nil)
	axis(&b, leftX, ticks(100, 4), func(v float64) string { return fmt.Sprintf("%.0f%%", v) })
	bars(&b, leftX, names, 100, [][]float64{hits}, []string{hitColor}, hitLabel)

	// Right: TTFT p50 and p99, on an axis in one unit (ms or s) chosen by its range.
	top, step := niceScale(maxOf(p99))
	unit := timeUnitFor(top, step)
	panelTitle(&b, rightX, "time to first token")
	legend(&b, rightX, []string{"p50", "p99"}, []string{p50Color, p99Color})
	axis(&b, rightX, ticks(top, int(math.Round(top/step))), unit.tick)
	bars(&b, rightX, names, top, [][]float64{p50, p99}, []string{p50Color, p99Color}, unit.value)

	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// chartTitle names the workload and what the chart shows: "Agent workload: prompt-cache hit
// rate and time to first token".
func chartTitle(r *Report) string {
	name := r.Workload
	if first, size := utf8.DecodeRuneInString(name); size > 0 {
		name = string(unicode.ToUpper(first)) + name[size:]
	}
	return strings.TrimSpace(name+" workload") + ": prompt-cache hit rate and time to first token"
}

// panelTitle writes a panel's title in the panels' title row.
func panelTitle(b *strings.Builder, x0 int, title string) {
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", x0, panelTitleY, esc(title))
}

// legend writes a panel's legend row: a swatch of each color before its item, or the items alone
// (a caption) without colors.
func legend(b *strings.Builder, x0 int, items, colors []string) {
	x := float64(x0)
	for i, item := range items {
		if i < len(colors) {
			fmt.Fprintf(b, `<rect x="%.0f" y="%d" width="11" height="11" fill="%s"/>`+"\n", x, legendY-10, colors[i])
			x += 16
		}
		fmt.Fprintf(b, `<text x="%.0f" y="%d" font-size="11" fill="%s">%s</text>`+"\n", x, legendY, mutedColor, esc(item))
		x += float64(utf8.RuneCountInString(item))*nameCharW + 18
	}
}

// ticks are n+1 evenly spaced values from 0 to top.
func ticks(top float64, n int) []float64 {
	n = max(n, 1)
	out := make([]float64, n+1)
	for i := range out {
		out[i] = top * float64(i) / float64(n)
	}
	return out
}

// axis draws a panel's horizontal grid lines and their value labels, the last tick at the top.
func axis(b *strings.Builder, x0 int, ticks []float64, label func(float64) string) {
	top := ticks[len(ticks)-1]
	for _, v := range ticks {
		y := float64(panelTop+panelH) - float64(panelH)*v/top
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
			cx, base+nameGap, labelRotationDeg, cx, base+nameGap, esc(name))
	}
}

// percentFormat formats percentages (0 to 100) with one decimal, or more when two different
// values would read the same (up to three).
func percentFormat(values []float64) func(float64) string {
	decimals := 1
	for ; decimals < 3; decimals++ {
		if distinctWhenFormatted(values, decimals) {
			break
		}
	}
	return func(v float64) string { return fmt.Sprintf("%.*f%%", decimals, v) }
}

// distinctWhenFormatted reports whether values that differ still differ printed with decimals.
func distinctWhenFormatted(values []float64, decimals int) bool {
	seen := map[string]float64{}
	for _, v := range values {
		s := fmt.Sprintf("%.*f", decimals, v)
		if prev, ok := seen[s]; ok && prev != v {
			return false
		}
		seen[s] = v
	}
	return true
}

// timeUnit formats one time axis, given in milliseconds, in a single unit.
type timeUnit struct {
	tick  func(ms float64) string // the grid labels
	value func(ms float64) string // the bars' labels
}

// timeUnitFor is milliseconds for an axis below a second, seconds from one second up. The ticks
// carry the decimals their step needs; the bars' values two decimals in seconds, whole
// milliseconds (one decimal on an axis below 10 ms).
func timeUnitFor(top, step float64) timeUnit {
	div, suffix := 1.0, "ms"
	if top >= 1000 {
		div, suffix = 1000, "s"
	}
	tickDecimals := decimalsOf(step / div)
	valueDecimals := 0
	if suffix == "s" {
		valueDecimals = 2
	} else if top < 10 {
		valueDecimals = 1
	}
	return timeUnit{
		tick:  func(ms float64) string { return fmt.Sprintf("%.*f%s", tickDecimals, ms/div, suffix) },
		value: func(ms float64) string { return fmt.Sprintf("%.*f%s", valueDecimals, ms/div, suffix) },
	}
}

// decimalsOf is the decimals it takes to print multiples of step exactly (step a 1, 2, 2.5 or
// 5 times a power of ten), at most 3.
func decimalsOf(step float64) int {
	for d := 0; d < 3; d++ {
		scaled := step * math.Pow(10, float64(d))
		if math.Abs(scaled-math.Round(scaled)) < 1e-9 {
			return d
		}
	}
	return 3
}

// niceScale returns an axis top at or above v and a step, 1, 2, 2.5 or 5 times a power of ten,
// dividing it into 3 or 4 intervals; for v ≤ 0 it is 1 and 0.25.
func niceScale(v float64) (top, step float64) {
	if v <= 0 {
		return 1, 0.25
	}
	raw := v / 4
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	step = 10 * p
	for _, m := range []float64{1, 2, 2.5, 5} {
		if raw <= m*p {
			step = m * p
			break
		}
	}
	return math.Ceil(v/step-1e-9) * step, step
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = math.Max(m, x)
	}
	return m
}

func esc(s string) string { return html.EscapeString(s) }
