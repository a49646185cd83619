package router

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/session/redistest"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// These tests run router replicas that share their session map through a real redis-server on a
// loopback port, in front of simulated workers.

const simModel = "sim-model"

func startSimFleet(t *testing.T, n int) *sim.Fleet {
	t.Helper()
	return startSimFleetOf(t, n, instantSim())
}

// instantSim is the simulated worker's configuration with no simulated time: every answer at once.
func instantSim() sim.Config {
	cfg := sim.DefaultConfig()
	cfg.TimeScale = 0
	return cfg
}

// startSimFleetOf runs n simulated workers of cfg on loopback until the test ends.
func startSimFleetOf(t testing.TB, n int, cfg sim.Config) *sim.Fleet {
	t.Helper()
	fleet, err := sim.StartLocal(n, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	return fleet
}

// redisReplicaConfig is a cache_aware router using the Redis session store. The timeout is
// generous unless a test is about timeouts: a slow scheduler on a shared machine must not turn
// into a store failure.
func redisReplicaConfig(redisURL string) config.Config {
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.SessionStore = "redis"
	cfg.RedisURL = redisURL
	cfg.RedisTimeout = 2 * time.Second
	return cfg
}

// startReplica starts a router with cfg and registers the fleet's workers.
func startReplica(t *testing.T, cfg config.Config, fleet *sim.Fleet) *testRouter {
	t.Helper()
	tr := startRouter(t, cfg)
	for _, u := range fleet.URLs() {
		if err := tr.AddWorker(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
	return tr
}

// startRedisReplicas starts a fleet of n simulated workers and two replicas in front of it that
// share the Redis srv (redisReplicaConfig, changed by tweak first when it is not nil): the two
// routers every shared-store test compares.
func startRedisReplicas(t *testing.T, srv *redistest.Server, n int, tweak func(*config.Config)) (fleet *sim.Fleet, a, b *testRouter) {
	t.Helper()
	fleet = startSimFleet(t, n)
	cfg := redisReplicaConfig(srv.URL())
	if tweak != nil {
		tweak(&cfg)
	}
	return fleet, startReplica(t, cfg, fleet), startReplica(t, cfg, fleet)
}

// conversation is one agent session; each turn resends the growing history.
type conversation struct {
	id      string
	history []map[string]string
	turns   int
}

func newConversation(id string) *conversation {
	return &conversation{id: id, history: []map[string]string{
		// The conversation's own text comes first, so that no session's history prefix-matches
		// another's and first placements spread over the workers.
		{"role": "system", "content": "Session " + id + ". " + strings.Repeat("You are a coding agent in a large repository. ", 10)},
		{"role": "user", "content": "Task for " + id + ": fix the failing test and explain the change."},
	}}
}

// turn sends the next turn through tr and returns the serving worker and the decision label.
func (c *conversation) turn(t *testing.T, tr *testRouter) (worker, decision string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": simModel, "messages": c.history, "max_tokens": 8})
	resp := tr.post(t, "/v1/chat/completions", string(body), "x-session-id", c.id)
	raw := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s turn %d: status %d: %s", c.id, c.turns+1, resp.StatusCode, raw)
	}
	c.turns++
	c.history = append(c.history,
		map[string]string{"role": "assistant", "content": fmt.Sprintf("Reply %d of %s.", c.turns, c.id)},
		map[string]string{"role": "user", "content": fmt.Sprintf("Turn %d: the tool printed %d lines.", c.turns, c.turns*13)})
	return resp.Header.Get(proxy.HeaderWorker), resp.Header.Get(proxy.HeaderDecision)
}

// follows sends c's next turn through tr and fails the test unless the turn landed on home by
// session_id_match: the check each step of a shared or remembered session makes. when names the
// step in the failure.
func (c *conversation) follows(t *testing.T, tr *testRouter, home, when string) {
	t.Helper()
	if w, d := c.turn(t, tr); w != home || d != cacheawareSessionMatch {
		t.Fatalf("%s %s via %s: %s on %s, want session_id_match on %s", c.id, when, tr.url, d, w, home)
	}
}

// storeHealth is the session_store object of a replica's /health.
func storeHealth(t *testing.T, tr *testRouter) (status int, s session.Status) {
	t.Helper()
	resp, err := http.Get(tr.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		SessionStore *session.Status `json:"session_store"`
	}
	raw := readAll(t, resp)
	if err := json.Unmarshal([]byte(raw), &body); err != nil || body.SessionStore == nil {
		t.Fatalf("/health body %s: %v", raw, err)
	}
	return resp.StatusCode, *body.SessionStore
}

// waitReachable polls /health until the replica reports its store reachable (the store tries
// Redis again once a second while it is down).
func waitReachable(t *testing.T, trs ...*testRouter) {
	t.Helper()
	for _, tr := range trs {
		ok := false
		for range 300 { // about 15 s
			if _, s := storeHealth(t, tr); s.Reachable {
				ok = true
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !ok {
			t.Fatalf("replica %s: the session store is still unreachable after 15s", tr.url)
		}
	}
}

func storeErrors(tr *testRouter, op string) float64 {
	return testutil.ToFloat64(tr.Metrics().SessionStoreErrors.WithLabelValues(op))
}

func storeResults(tr *testRouter, op, result string) float64 {
	return testutil.ToFloat64(tr.Metrics().SessionStoreRequests.WithLabelValues(op, result))
}

// assertShared places a new session through a and sends its next turns alternately through b
// and a: every turn lands on the first worker, by session_id_match.
func assertShared(t *testing.T, id string, a, b *testRouter) {
	t.Helper()
	c := newConversation(id)
	home, _ := c.turn(t, a)
	for i, tr := range []*testRouter{b, a, b} {
		c.follows(t, tr, home, fmt.Sprintf("turn %d (placed by the other replica)", i+2))
	}
}

const cacheawareSessionMatch = "session_id_match"

// Two replicas share one Redis: a session's turns alternate between them and all land on one
// worker, and the turns a replica did not place are session_id_match. Two replicas with memory
// stores, for contrast, do not know each other's sessions.
func TestRedisReplicasShareSessions(t *testing.T) {
	srv := redistest.Start(t)
	fleet, a, b := startRedisReplicas(t, srv, 3, func(c *config.Config) { c.RedisKeyPrefix = "it" })

	homes := map[string]int{}
	for s := range 8 {
		c := newConversation(fmt.Sprintf("agent-%d", s))
		home, _ := c.turn(t, a)
		homes[home]++
		for turn := 2; turn <= 6; turn++ {
			via := b
			if turn%2 == 1 {
				via = a
			}
			c.follows(t, via, home, fmt.Sprintf("turn %d", turn))
		}
		// The entry is where the documented key layout says, holding the worker tenant.
		if got, err := srv.Client().Get(t.Context(), sessionRedisKey("it", "session:"+c.id)).Result(); err != nil || got != home {
			t.Fatalf("redis key for %s = %q, %v; want %q", c.id, got, err, home)
		}
	}
	t.Logf("first placements per worker: %v", homes)
	if storeErrors(a, session.OpGet)+storeErrors(b, session.OpGet) != 0 {
		t.Fatal("store errors with a healthy Redis")
	}
	if hits := storeResults(b, session.OpGet, session.ResultHit); hits != 24 {
		t.Fatalf("replica B: %v store hits, want 24 (3 turns of 8 sessions)", hits)
	}

	// Control: with memory stores, B has never seen A's sessions.
	mem := testConfig()
	mem.Policy = "cache_aware"
	ma, mb := startReplica(t, mem, fleet), startReplica(t, mem, fleet)
	c := newConversation("agent-memory")
	c.turn(t, ma)
	if _, d := c.turn(t, mb); d == cacheawareSessionMatch {
		t.Fatal("a memory-store replica matched a session it never saw")
	}
}

// The session TTL is Redis's expiry of the entry: the key carries it, Redis drops the key when
// it passes, and the session is placed anew afterwards.
func TestRedisSessionTTLExpiresInRedis(t *testing.T) {
	srv := redistest.Start(t)
	_, a, b := startRedisReplicas(t, srv, 2, func(c *config.Config) { c.SessionTTL = time.Second })
	client := srv.Client()

	c := newConversation("short-lived")
	c.turn(t, a)
	key := sessionRedisKey("cacheroute", "session:"+c.id)
	if pttl := client.PTTL(t.Context(), key).Val(); pttl <= 0 || pttl > time.Second {
		t.Fatalf("PTTL of %s = %v, want in (0, 1s]", key, pttl)
	}
	for i := 0; client.Exists(t.Context(), key).Val() == 1; i++ {
		if i == 200 {
			t.Fatal("the key did not expire within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A placed the session and holds a local copy too; neither remembers it now.
	w, d := c.turn(t, a)
	if d == cacheawareSessionMatch {
		t.Fatal("replica A still matched the expired session")
	}
	// A's new placement is shared again.
	c.follows(t, b, w, "after the new placement")
}

// A worker removed through replica A's admin API is never chosen by A again, even for sessions
// Redis still points at it; the entries are overwritten with the new placement, which B then
// follows. Removed through B's admin API as well, neither replica routes to it.
func TestRedisWorkerRemovalThroughEitherReplica(t *testing.T) {
	srv := redistest.Start(t)
	_, a, b := startRedisReplicas(t, srv, 3, nil)

	// Place sessions until one worker holds at least two of them.
	var convs []*conversation
	homes := map[string][]*conversation{}
	var gone string
	for s := 0; gone == "" && s < 30; s++ {
		c := newConversation(fmt.Sprintf("removal-%d", s))
		home, _ := c.turn(t, a)
		convs = append(convs, c)
		homes[home] = append(homes[home], c)
		if len(homes[home]) == 2 {
			gone = home
		}
	}
	if gone == "" {
		t.Fatal("no worker got two of 30 sessions")
	}

	resp := a.post(t, "/remove_worker?url="+url.QueryEscape(gone), "")
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("remove through A: %d %s", resp.StatusCode, body)
	}
	for _, c := range homes[gone] {
		w, d := c.turn(t, a)
		if w == gone || d == cacheawareSessionMatch {
			t.Fatalf("%s via A after removal: %s on %s", c.id, d, w)
		}
		// B still has the worker, but Redis now says where A put the session.
		c.follows(t, b, w, "after the removal through A")
	}

	req, _ := http.NewRequest(http.MethodDelete, b.url+"/workers/"+url.PathEscape(gone), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("remove through B: %d %s", resp.StatusCode, body)
	}
	for i := range 12 {
		convs = append(convs, newConversation(fmt.Sprintf("after-removal-%d", i)))
	}
	for _, c := range convs {
		for _, tr := range []*testRouter{a, b} {
			if w, d := c.turn(t, tr); w == gone {
				t.Fatalf("%s via %s went to the removed worker (%s)", c.id, tr.url, d)
			}
		}
	}
}

// Redis killed in the middle of a run: every request still succeeds, served from each
// replica's local map (the sessions each has served keep their worker), the error counters
// rise, /health reports the store unreachable with 200; after Redis restarts on the same port
// the replicas reconnect by themselves and share sessions again, including a session placed
// during the outage.
func TestRedisKilledMidRunThenRestarted(t *testing.T) {
	srv := redistest.Start(t)
	_, a, b := startRedisReplicas(t, srv, 3, nil)

	convs := make([]*conversation, 4)
	homes := make([]string, 4)
	for i := range convs {
		convs[i] = newConversation(fmt.Sprintf("outage-%d", i))
		homes[i], _ = convs[i].turn(t, a)
		convs[i].follows(t, b, homes[i], "before the outage")
	}

	srv.Stop()
	for i, c := range convs {
		for _, tr := range []*testRouter{a, b} {
			c.follows(t, tr, homes[i], "during the outage (from the local map)")
		}
	}
	during := newConversation("placed-during-outage")
	duringHome, _ := during.turn(t, a)
	for _, tr := range []*testRouter{a, b} {
		if storeErrors(tr, session.OpGet) < 1 {
			t.Fatalf("replica %s: no get error counted while Redis is down", tr.url)
		}
		if storeResults(tr, session.OpGet, session.ResultSkipped)+storeResults(tr, session.OpGet, session.ResultError) < 4 {
			t.Fatalf("replica %s: fewer fallback gets than outage requests", tr.url)
		}
		code, st := storeHealth(t, tr)
		if code != http.StatusOK || st.Reachable || st.Backend != "redis" || st.LastError == "" {
			t.Fatalf("/health during the outage: %d %+v", code, st)
		}
	}

	srv.Restart()
	waitReachable(t, a, b)
	assertShared(t, "after-restart", a, b)
	// The session placed during the outage lives only in A's local map; its next turn through A
	// writes it back, and B follows it.
	during.follows(t, a, duringHome, "after recovery")
	during.follows(t, b, duringHome, "after recovery")
}

// Redis stalled (the process stopped with SIGSTOP: connections are accepted, nothing is
// answered). Every request completes while Redis is still stopped, so none waited for Redis:
// each store call that tried Redis ended at the timeout (counted as an error, the last error is
// a timeout), the others skipped Redis, and no get was answered by Redis.
func TestRedisStalledRequestsDoNotWait(t *testing.T) {
	srv := redistest.Start(t)
	_, a, b := startRedisReplicas(t, srv, 3, func(c *config.Config) { c.RedisTimeout = 100 * time.Millisecond })

	c := newConversation("stall")
	home, _ := c.turn(t, a)
	c.follows(t, b, home, "before the stall")
	answered := func(tr *testRouter) float64 {
		return storeResults(tr, session.OpGet, session.ResultHit) + storeResults(tr, session.OpGet, session.ResultMiss)
	}
	answeredA, answeredB := answered(a), answered(b)

	srv.Pause()
	defer srv.Resume()
	for i := range 6 {
		for _, tr := range []*testRouter{a, b} {
			c.follows(t, tr, home, fmt.Sprintf("stalled turn %d", i))
			newConversation(fmt.Sprintf("stall-new-%d", i)).turn(t, tr)
		}
	}
	if !srv.Paused() {
		t.Fatal("redis-server is no longer stopped: the requests may have waited for it")
	}
	for _, tr := range []*testRouter{a, b} {
		if storeErrors(tr, session.OpGet) < 1 {
			t.Fatalf("replica %s: no get error counted while Redis is stalled", tr.url)
		}
		if got := answered(tr); (tr == a && got != answeredA) || (tr == b && got != answeredB) {
			t.Fatalf("replica %s: Redis answered a get while stopped", tr.url)
		}
		_, st := storeHealth(t, tr)
		if st.Reachable || !(strings.Contains(st.LastError, "timeout") || strings.Contains(st.LastError, "deadline")) {
			t.Fatalf("replica %s: store status %+v, want unreachable after a timeout", tr.url, st)
		}
	}

	srv.Resume()
	waitReachable(t, a, b)
	assertShared(t, "after-stall", a, b)
}

// A router whose Redis is down when it starts serves with its local map and begins sharing
// once Redis is up, without a restart.
func TestRedisDownAtStartup(t *testing.T) {
	srv := redistest.Start(t)
	srv.Stop()
	_, a, b := startRedisReplicas(t, srv, 2, nil)
	a.Start(t.Context()) // the startup check must not block or fail

	c := newConversation("early")
	home, _ := c.turn(t, a)
	c.follows(t, a, home, "with Redis down")
	if code, st := storeHealth(t, a); code != http.StatusOK || st.Reachable {
		t.Fatalf("/health with Redis down: %d %+v", code, st)
	}

	srv.Restart()
	waitReachable(t, a, b)
	assertShared(t, "late", a, b)
}

// sessionRedisKey is where the documented key layout puts a session of simModel:
// <prefix>:sess2:<model>:<16 bytes of the session key's SHA-256, in hex>.
func sessionRedisKey(prefix, sessionKey string) string {
	sum := sha256.Sum256([]byte(sessionKey))
	return prefix + ":sess2:" + simModel + ":" + hex.EncodeToString(sum[:16])
}
