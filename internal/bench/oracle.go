package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"github.com/cacheroute/cacheroute/internal/sim"
)

// OraclePolicy is the --policies entry that runs without a router: each chat request goes to the
// simulated worker that really holds the longest prefix of it at that moment, read from the
// workers' caches in this process (ties, and requests nobody holds, to the worker with the fewest
// requests running and waiting). No router can know this; it is the hit rate that placement alone
// can reach on the fleet, load aside, and the yardstick for the policies' figures.
const OraclePolicy = "oracle"

// oracleDecision is the x-vllm-router-decision the oracle answers with.
const oracleDecision = "oracle"

// oracle is the oracle's HTTP front: a reverse proxy to the chosen worker.
type oracle struct {
	workers []*sim.Worker
	urls    []string
	proxies []*httputil.ReverseProxy
	srv     *http.Server
	url     string
}

// maxOracleBody bounds the request bodies the oracle reads, as a router bounds them.
const maxOracleBody = 64 << 20

// startOracle serves the oracle for fleet on a loopback port of ps.
func startOracle(fleet *sim.Fleet, ps *ports) (*oracle, error) {
	o := &oracle{workers: fleet.Workers(), urls: fleet.URLs()}
	for _, u := range o.urls {
		target, err := url.Parse(u)
		if err != nil {
			return nil, err
		}
		p := httputil.NewSingleHostReverseProxy(target)
		p.FlushInterval = -1 // stream every event as it comes
		o.proxies = append(o.proxies, p)
	}
	ln, err := ps.listen()
	if err != nil {
		return nil, err
	}
	o.url = "http://" + ln.Addr().String()
	o.srv = &http.Server{Handler: o}
	go func() { _ = o.srv.Serve(ln) }()
	return o, nil
}

func (o *oracle) stop() { _ = o.srv.Shutdown(context.Background()) }

// loads are the workers' running and waiting requests.
func (o *oracle) loads() []float64 { return simLoads(o.workers) }

func (o *oracle) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(rw, `{"error":{"message":"the oracle routes chat completions only","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxOracleBody+1))
	if err == nil && len(body) > maxOracleBody {
		err = errors.New("request body too large")
	}
	if err != nil {
		http.Error(rw, `{"error":{"message":`+strconv.Quote(err.Error())+`,"type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	best, bestHit, prompt := o.choose(body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	h := rw.Header()
	h.Set(headerRouterWorker, o.urls[best])
	h.Set(headerRouterDecision, oracleDecision)
	if prompt > 0 {
		h.Set(headerPrefixMatch, strconv.FormatFloat(float64(bestHit)/float64(prompt), 'f', 4, 64))
	}
	o.proxies[best].ServeHTTP(rw, r)
}

// choose returns the worker holding the longest cached prefix of body, the tokens it holds and
// the prompt's length; among equals, the least busy, ties broken at random.
func (o *oracle) choose(body []byte) (best, bestHit, prompt int) {
	best, bestHit = -1, -1
	var bestLoad, ties int
	for i, w := range o.workers {
		hit, n, err := w.CachedChatPrefix(body)
		if err != nil {
			hit = 0 // the worker will answer the error itself
		}
		prompt = n
		s := w.Stats()
		load := s.Running + s.Waiting
		switch {
		case hit > bestHit || hit == bestHit && load < bestLoad:
			best, bestHit, bestLoad, ties = i, hit, load, 1
		case hit == bestHit && load == bestLoad:
			ties++
			if rand.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best, bestHit, prompt
}
