// Package enginemetrics reads the workers' own load figures from their Prometheus /metrics (vLLM
// and SGLang names) on an interval and hands them to the pool's workers, for the engine load
// signal (--load-signal engine; see docs/load-signals.md).
//
// A scrape asks only for the families it needs (prometheus_client's ?name[]= filter), and the
// parser is a line scanner over the text exposition format that looks at those names only, so
// that scraping a large fleet often costs next to nothing (BenchmarkScrape64Workers).
package enginemetrics

import (
	"bytes"
	"math"
	"strconv"

	"github.com/cacheroute/cacheroute/internal/workers"
)

// The metric families a scrape asks for, and what each is.
const (
	VLLMRunning     = "vllm:num_requests_running"
	VLLMWaiting     = "vllm:num_requests_waiting"
	VLLMKVUsage     = "vllm:kv_cache_usage_perc"
	VLLMGPUKVUsage  = "vllm:gpu_cache_usage_perc" // vLLM before kv_cache_usage_perc
	SGLangRunning   = "sglang:num_running_reqs"
	SGLangWaiting   = "sglang:num_queue_reqs"
	SGLangTokenUsed = "sglang:token_usage"
	// VLLMCacheConfig is vLLM's cache configuration, as labels of an info gauge: its KV cache
	// holds num_gpu_blocks blocks of block_size tokens.
	VLLMCacheConfig = "vllm:cache_config_info"
	// SGLangMaxTokens is the tokens SGLang's KV cache holds.
	SGLangMaxTokens = "sglang:max_total_num_tokens"
)

// Names are the families requested with ?name[]=, in the order asked.
var Names = []string{VLLMRunning, VLLMWaiting, VLLMKVUsage, VLLMGPUKVUsage, SGLangRunning, SGLangWaiting, SGLangTokenUsed,
	VLLMCacheConfig, SGLangMaxTokens}

type kind uint8

const (
	other kind = iota
	running
	waiting
	kvUsage
	cacheConfig // the capacity is in the labels
	kvTokens    // the capacity is the value
)

func kindOf(name []byte) kind {
	switch string(name) { // no allocation: the compiler compares the bytes in place
	case VLLMRunning, SGLangRunning:
		return running
	case VLLMWaiting, SGLangWaiting:
		return waiting
	case VLLMKVUsage, VLLMGPUKVUsage, SGLangTokenUsed:
		return kvUsage
	case VLLMCacheConfig:
		return cacheConfig
	case SGLangMaxTokens:
		return kvTokens
	}
	return other
}

// Parse reads a /metrics page in the Prometheus text format (OpenMetrics text parses too) and
// returns the worker's figures: running and waiting requests summed over all their label sets
// (several models or engines on one worker), the KV cache usage averaged over its label sets, and
// the tokens its KV caches hold together (vLLM's num_gpu_blocks × block_size, SGLang's
// max_total_num_tokens).
// Every other line is skipped, so a worker that ignores the name[] filter and sends its whole page
// is read correctly. ok is false when the page has neither a running nor a waiting figure: the
// worker does not expose them, and its load falls back to the router's own count. Samples that
// are not finite numbers are ignored.
func Parse(page []byte) (stats workers.EngineStats, ok bool) {
	kvSamples := 0
	for len(page) > 0 {
		var line []byte
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i], page[i+1:]
		} else {
			line, page = page, nil
		}
		k, v, labels, good := parseLine(line)
		if !good {
			continue
		}
		switch k {
		case cacheConfig:
			stats.KVCapacityTokens += capacityOf(labels)
		case kvTokens:
			stats.KVCapacityTokens += v
		case running:
			stats.Running += v
			ok = true
		case waiting:
			stats.Waiting += v
			ok = true
		case kvUsage:
			stats.KVCacheUsage += v
			kvSamples++
		}
	}
	if kvSamples > 0 {
		stats.KVCacheUsage /= float64(kvSamples)
		stats.HasKVCacheUsage = true
	}
	return stats, ok
}

// parseLine reads one sample line of a wanted family: `name[{labels}] value [timestamp]`, and
// returns its label set ("{...}", or nil) with its value.
func parseLine(line []byte) (k kind, v float64, labelSet []byte, good bool) {
	for len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
		line = line[1:]
	}
	if len(line) == 0 || (line[0] != 'v' && line[0] != 's') { // comments, blank lines, other families
		return other, 0, nil, false
	}
	end := 0
	for end < len(line) && line[end] != '{' && line[end] != ' ' && line[end] != '\t' {
		end++
	}
	k = kindOf(line[:end])
	if k == other {
		return other, 0, nil, false
	}
	rest := line[end:]
	labels := len(rest) > 0 && rest[0] == '{'
	if labels {
		n := skipLabels(rest)
		if n < 0 {
			return other, 0, nil, false
		}
		labelSet, rest = rest[:n], rest[n:]
	}
	// The value: after blanks (at least one after a bare name), up to the next blank (a timestamp
	// may follow) or the end.
	i := 0
	for i < len(rest) && (rest[i] == ' ' || rest[i] == '\t') {
		i++
	}
	if i == 0 && !labels {
		return other, 0, nil, false
	}
	rest = rest[i:]
	j := 0
	for j < len(rest) && rest[j] != ' ' && rest[j] != '\t' && rest[j] != '\r' {
		j++
	}
	v, err := strconv.ParseFloat(string(rest[:j]), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return other, 0, nil, false
	}
	return k, v, labelSet, true
}

// capacityOf is the tokens a cache_config_info label set says the KV cache holds:
// num_gpu_blocks × block_size, 0 when either is missing or not a positive whole number.
func capacityOf(labelSet []byte) float64 {
	blocks, _ := strconv.ParseUint(labelValue(labelSet, "num_gpu_blocks"), 10, 32)
	size, _ := strconv.ParseUint(labelValue(labelSet, "block_size"), 10, 32)
	return float64(blocks) * float64(size)
}

// labelValue is the value of label name in a label set ("{a="1",b="2"}"), escapes left as they
// are (the values read here are numbers); "" when absent.
func labelValue(labelSet []byte, name string) string {
	rest := labelSet
	if len(rest) > 0 && rest[0] == '{' {
		rest = rest[1:]
	}
	for len(rest) > 0 {
		eq := bytes.IndexByte(rest, '=')
		if eq < 0 || eq+1 >= len(rest) || rest[eq+1] != '"' {
			return ""
		}
		key := bytes.TrimSpace(bytes.TrimLeft(rest[:eq], ", "))
		val := rest[eq+2:]
		end := 0
		for end < len(val) && val[end] != '"' {
			if val[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(val) {
			return ""
		}
		if string(key) == name {
			return string(val[:end])
		}
		rest = val[end+1:]
	}
	return ""
}

// skipLabels returns the length of the label set at the start of b ("{...}"), quoted values
// (which may hold '}' and escaped quotes) included, or -1 when it does not end.
func skipLabels(b []byte) int {
	quoted := false
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case quoted && c == '\\':
			i++ // the escaped character
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i + 1
		}
	}
	return -1
}
