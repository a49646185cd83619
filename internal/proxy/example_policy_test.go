package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/policy/registry"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// lastFirst is the package doc's kind of example: a policy written in one screen against the
// contract, registered by name, that sends every request to the last candidate and records what
// its hooks heard.
type lastFirst struct {
	policy.Base
	mu       sync.Mutex
	accepted []string
	done     []policy.Usage
}

const lastFirstName = "last_first"

func (*lastFirst) Name() string { return lastFirstName }

func (*lastFirst) Select(in policy.Input) policy.Decision {
	return in.Pick(in.Candidates[len(in.Candidates)-1], lastFirstName)
}

func (p *lastFirst) Accepted(_ policy.Input, d policy.Decision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.accepted = append(p.accepted, d.Worker.Name())
}

func (p *lastFirst) Done(_ policy.Input, _ policy.Decision, o workers.Outcome, u policy.Usage) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if o == workers.Succeeded {
		p.done = append(p.done, u)
	}
	return false
}

// lastFirstBuilt is the instance the registry's factory made last.
var lastFirstBuilt struct {
	sync.Mutex
	p *lastFirst
}

func init() {
	policy.Register(policy.Entry{Spec: registry.Spec{Name: lastFirstName, Summary: "the last candidate"},
		New: func(policy.Env, registry.Options) policy.Policy {
			p := &lastFirst{}
			lastFirstBuilt.Lock()
			lastFirstBuilt.p = p
			lastFirstBuilt.Unlock()
			return p
		}})
}

func TestAPolicyWrittenAgainstTheContractIsChosenByNameAndHearsAcceptedAndDone(t *testing.T) {
	cfg := config.Default()
	cfg.Policy = lastFirstName
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the configuration does not accept the registered policy: %v", err)
	}
	p, err := policy.New(cfg.Policy, policy.Env{}, cfg.PolicyOptions[cfg.Policy])
	if err != nil {
		t.Fatal(err)
	}
	lastFirstBuilt.Lock()
	built := lastFirstBuilt.p
	lastFirstBuilt.Unlock()
	if p != policy.Policy(built) {
		t.Fatalf("policy.New(%q) did not build through the registered factory", cfg.Policy)
	}
	worker := func(name string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			rw.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(rw, `{"id":"`+name+`","choices":[],"usage":{"prompt_tokens":42,"prompt_tokens_details":{"cached_tokens":32}}}`)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := worker("a"), worker("b")
	tp := newTestProxy(t, setup{policy: p, urls: []string{a.URL, b.URL}})
	status, h, _ := tp.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if status != http.StatusOK || h.Get(HeaderDecision) != lastFirstName || h.Get(HeaderWorker) != tp.worker(t, b.URL).Name() {
		t.Fatalf("status %d, decision %q, worker %q; want 200 from the last worker, labelled %s", status, h.Get(HeaderDecision), h.Get(HeaderWorker), lastFirstName)
	}
	// The exchange ends once the answer is written: wait for Done, against a deadline.
	testkit.WaitWithin(t, 10*time.Second, "Done heard", func() bool {
		built.mu.Lock()
		defer built.mu.Unlock()
		return len(built.done) > 0
	})
	built.mu.Lock()
	defer built.mu.Unlock()
	if len(built.accepted) != 1 || built.accepted[0] != tp.worker(t, b.URL).Name() {
		t.Errorf("Accepted heard %v, want the last worker once", built.accepted)
	}
	if want := (policy.Usage{Known: true, Prompt: 42, Cached: 32}); len(built.done) != 1 || built.done[0] != want {
		t.Errorf("Done heard %v, want one success with %+v", built.done, want)
	}
}
