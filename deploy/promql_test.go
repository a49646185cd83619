package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// selector is one series selector of a PromQL expression: a metric name and the label names its
// matchers use.
type selector struct {
	Metric string
	Labels []string
}

// promRefs is what an expression refers to.
type promRefs struct {
	Selectors []selector
	Grouping  []string // labels of by, without, on, ignoring, group_left and group_right
}

var promKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"inf": true, "nan": true,
}

var promGrouping = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// promFunctions are PromQL's functions and aggregations; a name followed by "(" must be one.
var promFunctions = map[string]bool{}

// promAggregations may take their by or without clause before their argument.
var promAggregations = map[string]bool{}

// startsWord reports whether s starts with one of the words, followed by a character that cannot
// continue it.
func startsWord(s string, words ...string) bool {
	for _, w := range words {
		if strings.HasPrefix(strings.ToLower(s), w) && (len(s) == len(w) || !isIdent(s[len(w)])) {
			return true
		}
	}
	return false
}

func init() {
	for f := range strings.FieldsSeq(`sum min max avg group stddev stdvar count count_values bottomk topk
		quantile limitk limit_ratio`) {
		promAggregations[f] = true
	}
	for f := range strings.FieldsSeq(`sum min max avg group stddev stdvar count count_values bottomk topk
		quantile limitk limit_ratio abs absent absent_over_time ceil changes clamp clamp_max clamp_min
		day_of_month day_of_week day_of_year days_in_month delta deriv exp floor histogram_avg
		histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar
		histogram_sum holt_winters double_exponential_smoothing hour idelta increase irate
		label_join label_replace ln log2 log10 minute month predict_linear rate resets round scalar
		sgn sort sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year
		avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time
		stddev_over_time stdvar_over_time last_over_time present_over_time mad_over_time acos acosh
		asin asinh atan atanh cos cosh sin sinh tan tanh deg pi rad start end info`) {
		promFunctions[f] = true
	}
}

// parsePromQL finds the series selectors and grouping labels of a PromQL expression with a small
// tokenizer: it skips strings, numbers and durations, range and subquery brackets, comments and
// Grafana variables ($x, ${x}, [[x]]), and checks that brackets balance. It does not check the
// grammar beyond that; Prometheus does, when it loads the rules.
func parsePromQL(expr string) (promRefs, error) {
	var refs promRefs
	var stack []byte
	i := 0
	n := len(expr)
	peek := func(j int) byte {
		for j < n && isSpace(expr[j]) {
			j++
		}
		if j < n {
			return expr[j]
		}
		return 0
	}
	skipSpace := func(j int) int {
		for j < n && isSpace(expr[j]) {
			j++
		}
		return j
	}
	for i < n {
		c := expr[i]
		switch {
		case isSpace(c):
			i++
		case c == '#':
			for i < n && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, i)
			if err != nil {
				return refs, err
			}
			i = end
		case c == '$':
			i = skipVariable(expr, i)
		case c == '[' && i+1 < n && expr[i+1] == '[': // Grafana's old [[variable]]
			end := strings.Index(expr[i:], "]]")
			if end < 0 {
				return refs, fmt.Errorf("unclosed [[ at %d", i)
			}
			i += end + 2
		case c == '[': // a range or subquery: durations and variables only
			end := strings.IndexByte(expr[i:], ']')
			if end < 0 {
				return refs, fmt.Errorf("unclosed [ at %d", i)
			}
			i += end + 1
		case c == '(':
			stack = append(stack, '(')
			i++
		case c == ')':
			if len(stack) == 0 || stack[len(stack)-1] != '(' {
				return refs, fmt.Errorf("unbalanced ) at %d", i)
			}
			stack = stack[:len(stack)-1]
			i++
		case c == '{': // a selector without a name
			labels, end, err := parseMatchers(expr, i)
			if err != nil {
				return refs, err
			}
			refs.Selectors = append(refs.Selectors, selector{Labels: labels})
			i = end
		case c == '}' || c == ']':
			return refs, fmt.Errorf("unbalanced %c at %d", c, i)
		case isDigit(c) || (c == '.' && i+1 < n && isDigit(expr[i+1])):
			for i < n && (isIdent(expr[i]) || expr[i] == '.' || ((expr[i] == '+' || expr[i] == '-') && (expr[i-1] == 'e' || expr[i-1] == 'E'))) {
				i++
			}
		case isIdentStart(c):
			start := i
			for i < n && isIdent(expr[i]) {
				i++
			}
			word := expr[start:i]
			lower := strings.ToLower(word)
			switch {
			case promGrouping[lower]:
				if peek(i) != '(' {
					if lower == "group_left" || lower == "group_right" {
						continue
					}
					return refs, fmt.Errorf("%s without its label list at %d", word, start)
				}
				j := skipSpace(i) + 1
				end := strings.IndexByte(expr[j:], ')')
				if end < 0 {
					return refs, fmt.Errorf("unclosed %s ( at %d", word, start)
				}
				for l := range strings.SplitSeq(expr[j:j+end], ",") {
					if l = strings.TrimSpace(l); l != "" {
						if !isLabelName(l) {
							return refs, fmt.Errorf("%s (%s): %q is not a label name", word, expr[j:j+end], l)
						}
						refs.Grouping = append(refs.Grouping, l)
					}
				}
				i = j + end + 1
			case promKeywords[lower]:
			case promAggregations[word] && startsWord(expr[skipSpace(i):], "by", "without"):
				// sum by (l) (...): the aggregation's modifier comes before its argument
			case peek(i) == '(':
				if !promFunctions[word] {
					return refs, fmt.Errorf("unknown function %s", word)
				}
			case peek(i) == '{':
				labels, end, err := parseMatchers(expr, skipSpace(i))
				if err != nil {
					return refs, err
				}
				refs.Selectors = append(refs.Selectors, selector{Metric: word, Labels: labels})
				i = end
			default:
				refs.Selectors = append(refs.Selectors, selector{Metric: word})
			}
		case strings.IndexByte("+-*/%^=!<>,@:", c) >= 0:
			i++
		default:
			return refs, fmt.Errorf("unexpected %q at %d", c, i)
		}
	}
	if len(stack) > 0 {
		return refs, fmt.Errorf("unclosed (")
	}
	return refs, nil
}

// parseMatchers reads {name op "value", ...} from expr[i] == '{' and returns the label names and
// the index after '}'.
func parseMatchers(expr string, i int) ([]string, int, error) {
	var labels []string
	i++
	for {
		for i < len(expr) && (isSpace(expr[i]) || expr[i] == ',') {
			i++
		}
		if i >= len(expr) {
			return nil, i, fmt.Errorf("unclosed {")
		}
		if expr[i] == '}' {
			return labels, i + 1, nil
		}
		start := i
		for i < len(expr) && isIdent(expr[i]) && expr[i] != ':' {
			i++
		}
		name := expr[start:i]
		if !isLabelName(name) {
			return nil, i, fmt.Errorf("matcher at %d: want a label name", start)
		}
		for i < len(expr) && isSpace(expr[i]) {
			i++
		}
		op := ""
		for _, o := range []string{"=~", "!~", "!=", "="} {
			if strings.HasPrefix(expr[i:], o) {
				op = o
				break
			}
		}
		if op == "" {
			return nil, i, fmt.Errorf("matcher %s at %d: want =, !=, =~ or !~", name, start)
		}
		i += len(op)
		for i < len(expr) && isSpace(expr[i]) {
			i++
		}
		if i >= len(expr) || (expr[i] != '"' && expr[i] != '\'' && expr[i] != '`') {
			return nil, i, fmt.Errorf("matcher %s at %d: want a quoted value", name, start)
		}
		end, err := skipString(expr, i)
		if err != nil {
			return nil, i, err
		}
		i = end
		labels = append(labels, name)
	}
}

func skipString(expr string, i int) (int, error) {
	q := expr[i]
	for j := i + 1; j < len(expr); j++ {
		if expr[j] == '\\' && q != '`' {
			j++
			continue
		}
		if expr[j] == q {
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unclosed string at %d", i)
}

func skipVariable(expr string, i int) int {
	i++
	if i < len(expr) && expr[i] == '{' {
		if end := strings.IndexByte(expr[i:], '}'); end >= 0 {
			return i + end + 1
		}
	}
	for i < len(expr) && isIdent(expr[i]) && expr[i] != ':' {
		i++
	}
	return i
}

func isSpace(c byte) bool      { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool { return c == '_' || c == ':' || (c|0x20 >= 'a' && c|0x20 <= 'z') }
func isIdent(c byte) bool      { return isIdentStart(c) || isDigit(c) }

func isLabelName(s string) bool {
	if s == "" || isDigit(s[0]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isIdent(s[i]) || s[i] == ':' {
			return false
		}
	}
	return true
}

func TestParsePromQL(t *testing.T) {
	for _, tc := range []struct {
		expr     string
		metrics  []string
		labels   []string // of the selectors, in order
		grouping []string
	}{
		{`up`, []string{"up"}, nil, nil},
		{`sum by (route, status_class) (rate(a_total{job="$job", route=~"$route"}[$__rate_interval]))`,
			[]string{"a_total"}, []string{"job", "route"}, []string{"route", "status_class"}},
		{`histogram_quantile(0.99, sum(rate(h_bucket{x="}"}[5m])) by (le))`, []string{"h_bucket"}, []string{"x"}, []string{"le"}},
		{`a - on (job) group_left b > 0 and c offset 1h30m`, []string{"a", "b", "c"}, nil, []string{"job"}},
		{`sum without(x)(a) + count by(y)(b) + max(c) by (z)`, []string{"a", "b", "c"}, nil, []string{"x", "y", "z"}},
		{"x{a=\"1\"} / ignoring(a) group_right(b) y # a comment naming z\n", []string{"x", "y"}, []string{"a"}, []string{"a", "b"}},
		{`max_over_time(m[1h:5m]) * 1e3 + 2 * -0.5`, []string{"m"}, nil, nil},
		{`label_replace(m, "dst", "$1", "src", "(.*)")`, []string{"m"}, nil, nil},
		{`{__name__="n"}`, []string{""}, []string{"__name__"}, nil},
		{`rate(x[${__rate_interval}]) * [[scale]]`, []string{"x"}, nil, nil},
	} {
		refs, err := parsePromQL(tc.expr)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		var metrics, labels []string
		for _, s := range refs.Selectors {
			metrics = append(metrics, s.Metric)
			labels = append(labels, s.Labels...)
		}
		if !slices.Equal(metrics, tc.metrics) || !slices.Equal(labels, tc.labels) || !slices.Equal(refs.Grouping, tc.grouping) {
			t.Errorf("%s: metrics %q labels %q grouping %q, want %q %q %q", tc.expr, metrics, labels, refs.Grouping, tc.metrics, tc.labels, tc.grouping)
		}
	}
	for _, bad := range []string{
		`sum(rate(x[5m])`, `x{a="1"`, `x{a}`, `x)`, `rat(x[5m])`, `sum by x`, `x{a="1}`, `x{a=1}`,
	} {
		if _, err := parsePromQL(bad); err == nil {
			t.Errorf("%s: parsed without an error", bad)
		}
	}
}
