package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// budgetBody is the size of the bodies the body budget tests send: bodyBudgetProxy's budget
// holds one (twice its bytes: the body and the copy routing makes of it) but not two.
const budgetBody = 700 << 10

// bodyBudgetProxy is a router whose body budget holds one budgetBody but not two.
func bodyBudgetProxy(t *testing.T, bodyTimeout time.Duration) *testProxy {
	t.Helper()
	opts := testOptions()
	opts.MaxBodyBytesTotal = 2 << 20
	opts.ClientBodyTimeout = bodyTimeout
	return newTestProxy(t, setup{opts: &opts, urls: []string{okWorker(t, "a").URL}})
}

// chatOfSize is a chat request body of exactly n bytes.
func chatOfSize(n int) string {
	head, tail := `{"model":"m","messages":[{"role":"user","content":"`, `"}]}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// startBody sends a request's headers and the first half of its body on a new connection, and
// leaves it there: the router holds the body's bytes until the rest comes.
func startBody(t *testing.T, tp *testProxy, path, body string, header ...string) (net.Conn, string) {
	t.Helper()
	c := tp.dial(t)
	req := rawRequest(http.MethodPost, path, body, header...)
	half := len(req) - len(body)/2
	if _, err := io.WriteString(c, req[:half]); err != nil {
		t.Fatal(err)
	}
	// The half sent is counted twice once the router read it: the bytes and their copy. A
	// second body of the same size then cannot fit.
	testkit.WaitWithin(t, 5*time.Second, "the first half counted", func() bool { return tp.Server.bodies.Held() >= int64(len(body)) })
	return c, req[half:]
}

// readAhead is what fasthttp reads of a body with its headers, before the router sees the
// request: the router's own reading starts after it.
const readAhead = 8 << 10

// bodyStart sends a request's headers and the first readAhead bytes of its body, and reads the
// answer: one refused for its announced length comes without the rest.
func bodyStart(t *testing.T, tp *testProxy, path, body string, header ...string) (*http.Response, string) {
	t.Helper()
	c := tp.dial(t)
	req := rawRequest(http.MethodPost, path, body, header...)
	if _, err := io.WriteString(c, req[:len(req)-len(body)+readAhead]); err != nil {
		t.Fatal(err)
	}
	return readAnswer(t, c)
}

func readAnswer(t *testing.T, c net.Conn) (*http.Response, string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp, string(b)
}

// A body whose announced length cannot fit in what is left of the budget is refused before it is
// read.
func TestBodyBudget_ABodyThatCannotFitIs503WithRetryAfterBeforeItIsRead(t *testing.T) {
	tp := bodyBudgetProxy(t, 20*time.Second)
	body := chatOfSize(budgetBody)
	first, rest := startBody(t, tp, chatPath, body)

	// The second request sends its headers and the start of its body: the refusal must come
	// without the rest.
	resp, got := bodyStart(t, tp, chatPath, body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("second body: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if code := errorCode(t, got); code != "request_bodies_over_budget" {
		t.Fatalf("code %q", code)
	}

	// The first request was within the budget and goes through once its body is complete.
	if _, err := io.WriteString(first, rest); err != nil {
		t.Fatal(err)
	}
	if resp, got := readAnswer(t, first); resp.StatusCode != http.StatusOK {
		t.Fatalf("first body: %d %s", resp.StatusCode, got)
	}
	// Its bytes are given back at its end: the same body is accepted now.
	testkit.WaitWithin(t, 5*time.Second, "the budget given back", func() bool { return tp.Server.bodies.Held() == 0 })
	if status, _, got := tp.post(t, chatPath, body); status != http.StatusOK {
		t.Fatalf("after the first ended: %d %s", status, got)
	}
}

func TestBodyBudget_AnthropicRouteIsRefusedInItsOwnShape(t *testing.T) {
	tp := bodyBudgetProxy(t, 20*time.Second)
	body := chatOfSize(budgetBody)
	startBody(t, tp, "/v1/messages", body)
	resp, got := bodyStart(t, tp, "/v1/messages", body)
	if resp.StatusCode != statusOverloaded || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("%d, Retry-After %q; want 529 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if typ := anthropicErrorType(t, got); typ != "overloaded_error" {
		t.Fatalf("type %q", typ)
	}
}

func TestBodyBudget_EveryWayARequestEndsGivesItsBytesBackOnce(t *testing.T) {
	tp := bodyBudgetProxy(t, 300*time.Millisecond)
	body := chatOfSize(budgetBody)
	for i := range 3 {
		// Answered.
		if status, _, got := tp.post(t, chatPath, body); status != http.StatusOK {
			t.Fatalf("round %d: %d %s", i, status, got)
		}
		// Refused while another holds the budget, then that one abandoned mid-body.
		held, _ := startBody(t, tp, chatPath, body)
		if resp, _ := bodyStart(t, tp, chatPath, body); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("round %d: over the budget got %d", i, resp.StatusCode)
		}
		_ = held.Close()
		testkit.WaitWithin(t, 5*time.Second, "the abandoned body given back", func() bool { return tp.Server.bodies.Held() == 0 })
		// Too slow: cut by the body timeout with 408.
		slow, _ := startBody(t, tp, chatPath, body)
		if resp, _ := readAnswer(t, slow); resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("round %d: slow body got %d", i, resp.StatusCode)
		}
		testkit.WaitWithin(t, 5*time.Second, "the slow body given back", func() bool { return tp.Server.bodies.Held() == 0 })
		// Chunked, abandoned between two chunks: its read fails at once, and no answer reaches
		// anyone.
		c := tp.dial(t)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n", chatPath)
		testkit.WaitWithin(t, 5*time.Second, "the chunked body counted", func() bool { return tp.Server.bodies.Held() > 0 })
		_ = c.Close()
		testkit.WaitWithin(t, 5*time.Second, "every byte given back", func() bool { return tp.Server.bodies.Held() == 0 })
	}
	if status, _, got := tp.post(t, chatPath, body); status != http.StatusOK {
		t.Fatalf("at the end: %d %s", status, got)
	}
}

func TestBodyBudget_AStreamedAnswerHoldsItsBodyUntilTheStreamEnds(t *testing.T) {
	more := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(more) }) }
	w := testkit.NewServer(t, func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(rw, "data: {\"i\":0}\n\n")
		rw.(http.Flusher).Flush()
		<-more
		_, _ = io.WriteString(rw, "data: [DONE]\n\n")
	})
	t.Cleanup(finish) // runs before the worker's Close, which waits for this handler
	opts := testOptions()
	opts.MaxBodyBytesTotal = 2 << 20
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{w.URL}})

	head, tail := `{"model":"m","stream":true,"messages":[{"role":"user","content":"`, `"}]}`
	content := strings.Repeat("x", 600<<10)
	body := head + content + tail
	c := tp.dial(t)
	if _, err := io.WriteString(c, rawRequest(http.MethodPost, chatPath, body)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data:") {
		t.Fatalf("first event: %q %v", line, err)
	}
	// The handler has returned and the relay streams: the body still counts until the end, and
	// so does the history key routing derived from it, a copy of its content.
	if held, want := tp.Server.bodies.Held(), int64(len(body)+len(content)); held < want {
		t.Fatalf("while streaming %d bytes held, want at least %d: the body and its content's copy", held, want)
	}
	finish()
	_, _ = io.Copy(io.Discard, resp.Body)
	testkit.WaitWithin(t, 5*time.Second, "the budget given back at the stream's end", func() bool { return tp.Server.bodies.Held() == 0 })
}

func TestHeadersTooLargeAreAnsweredInTheShapeOfTheRouteTheRequestLineNames(t *testing.T) {
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "a").URL}})
	big := "X-Big: " + strings.Repeat("a", 20<<10)
	// On a fresh connection, and on one that served a request of the other protocol before.
	c := tp.dial(t)
	if status := roundTrip(t, c, rawRequest(http.MethodPost, chatPath, chatBody)); status != http.StatusOK {
		t.Fatalf("first request: %d", status)
	}
	for _, conn := range []net.Conn{tp.dial(t), c} {
		if _, err := io.WriteString(conn, rawRequest(http.MethodPost, "/v1/messages?beta=true", `{}`, big)); err != nil {
			t.Fatal(err)
		}
		resp, body := readAnswer(t, conn)
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if typ := anthropicErrorType(t, body); typ != "invalid_request_error" {
			t.Fatalf("type %q", typ)
		}
	}
	resp, body := readAnswer(t, func() net.Conn {
		conn := tp.dial(t)
		_, _ = io.WriteString(conn, rawRequest(http.MethodPost, chatPath, `{}`, big))
		return conn
	}())
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || errorCode(t, body) != "headers_too_large" {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
}

func TestRequestLinePathReadsOriginAndAbsoluteForms(t *testing.T) {
	for in, want := range map[string]string{
		"POST /v1/messages HTTP/1.1\r\nHost: x":                      "/v1/messages",
		"POST /v1/messages?beta=true HTTP/1.1\r\n":                   "/v1/messages",
		"POST http://router:30000/v1/messages/count_tokens HTTP/1.1": "/v1/messages/count_tokens",
		"POST /v1/messages":                                          "", // the line was cut: not trusted
		"POST http://router HTTP/1.1":                                "",
		"":                                                           "",
	} {
		if got := requestLinePath([]byte(in)); got != want {
			t.Errorf("requestLinePath(%q) = %q, want %q", in, got, want)
		}
	}
}

// Uploads that trickle hold what they sent, not what they may still send: a chunked body may
// grow to --max-payload-size, yet eight of them that sent a byte each leave the budget to the
// other clients.
func TestBodyBudget_TricklingUploadsHoldWhatTheySentNotWhatTheyMaySend(t *testing.T) {
	opts := testOptions()
	opts.MaxPayloadSize = 1 << 20
	opts.MaxBodyBytesTotal = 2 << 20 // two chunked bodies, were each counted as the most it may grow to
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{okWorker(t, "a").URL}})

	const trickles = 8
	for range trickles {
		c := tp.dial(t)
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n", chatPath); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitWithin(t, 5*time.Second, "every trickle counted", func() bool {
		return tp.Server.bodies.Held() >= int64(trickles*2*os.Getpagesize())
	})
	if status, _, got := tp.post(t, chatPath, chatOfSize(100<<10)); status != http.StatusOK {
		t.Fatalf("a body beside the trickles: %d %s, want 200", status, got)
	}
	if held, most := tp.Server.bodies.Held(), int64(trickles*2*2*os.Getpagesize()); held > most {
		t.Errorf("the trickles hold %d bytes, want at most %d: twice a page ahead of the byte each sent", held, most)
	}
}

// One client's requests hold at most its share of the budget; another client's body goes through
// meanwhile. A client is its key's tenant here (else its address).
func TestBodyBudget_OneClientHoldsNoMoreThanItsShare(t *testing.T) {
	opts := testOptions()
	opts.ClientKeys = keySet(t, "sk-alice tenant=alice\nsk-bob tenant=bob\n")
	opts.MaxBodyBytesTotal = 8 << 20
	opts.MaxBodyBytesPerClient = 2 << 20
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{okWorker(t, "a").URL}})
	alice := "Authorization: Bearer sk-alice"
	body := chatOfSize(budgetBody)

	first, rest := startBody(t, tp, chatPath, body, alice)
	resp, got := bodyStart(t, tp, chatPath, body, alice)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("alice's second body: %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if code := errorCode(t, got); code != "request_bodies_over_client_budget" {
		t.Fatalf("code %q", code)
	}
	if status, _, got := tp.post(t, chatPath, body, "Authorization", "Bearer sk-bob"); status != http.StatusOK {
		t.Fatalf("bob's body beside alice's: %d %s, want 200", status, got)
	}
	if _, err := io.WriteString(first, rest); err != nil {
		t.Fatal(err)
	}
	if resp, got := readAnswer(t, first); resp.StatusCode != http.StatusOK {
		t.Fatalf("alice's first body: %d %s", resp.StatusCode, got)
	}
}

// When more bodies arrive at once than the budget holds, the younger ones give way to the older:
// a body that needs room under the total takes it from the bodies that started after it, which
// are refused, so the first ones finish rather than all filling the budget halfway.
func TestBodyBudget_AYoungerBodyGivesWayToAnOlderOne(t *testing.T) {
	tp := bodyBudgetProxy(t, 20*time.Second)
	body := chatOfSize(budgetBody)
	older, rest := startBody(t, tp, chatPath, body)
	before := tp.Server.bodies.Held()

	younger := tp.dial(t) // chunked: no length to refuse it by; it fits beside the older one's half
	chunk := strings.Repeat("x", budgetBody/2)
	if _, err := fmt.Fprintf(younger, "POST %s HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", chatPath, len(chunk), chunk); err != nil {
		t.Fatal(err)
	}
	testkit.WaitWithin(t, 5*time.Second, "the younger body counted", func() bool { return tp.Server.bodies.Held() >= before+int64(len(chunk)) })

	if _, err := io.WriteString(older, rest); err != nil {
		t.Fatal(err)
	}
	if resp, got := readAnswer(t, older); resp.StatusCode != http.StatusOK {
		t.Fatalf("the older body: %d %s, want 200", resp.StatusCode, got)
	}
	resp, got := readAnswer(t, younger)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || errorCode(t, got) != "request_bodies_over_budget" {
		t.Fatalf("the younger body: %d %s, want 503 request_bodies_over_budget with Retry-After", resp.StatusCode, got)
	}
	testkit.WaitWithin(t, 5*time.Second, "every byte given back", func() bool { return tp.Server.bodies.Held() == 0 })
}
