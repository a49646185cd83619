package cli

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

func TestSimRefusesAnUnknownKVEventsEncoding(t *testing.T) {
	_, _, err := run(context.Background(), "sim", "--port", "0", "--kv-events-endpoint", "tcp://127.0.0.1:5557", "--kv-events-encoding", "json")
	if err == nil || !strings.Contains(err.Error(), "encoding") {
		t.Fatalf("err = %v, want the encoding refused", err)
	}
}

// TestSimPublishesKVEventsToTheSubscriberItDials runs `cacheroute sim` with a loopback endpoint
// (no wildcard: the sim dials, the subscriber binds) and reads the clear that a reset publishes.
func TestSimPublishesKVEventsToTheSubscriberItDials(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	endpoint := "tcp://127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	msgs := make(chan zmq4.Msg, 16)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			default: // the test has what it needs
			}
		}
	}()
	port := strconv.Itoa(testkit.FreePort(t))
	done := make(chan error, 1)
	go func() {
		_, _, err := run(ctx, "sim", "--port", port, "--time-scale", "0", "--kv-events-endpoint", endpoint,
			"--kv-events-topic", "kv@sim", "--kv-events-encoding", "map")
		done <- err
	}()
	var got zmq4.Msg
	deadline := time.After(10 * time.Second)
	for got.Frames == nil {
		if resp, err := http.Post("http://127.0.0.1:"+port+"/reset_prefix_cache", "application/json", nil); err == nil {
			resp.Body.Close()
		}
		select {
		case got = <-msgs:
		case err := <-done:
			t.Fatalf("sim ended: %v", err)
		case <-deadline:
			t.Fatal("timed out waiting for an event batch")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if len(got.Frames) != 3 || string(got.Frames[0]) != "kv@sim" || len(got.Frames[1]) != 8 {
		t.Fatalf("frames %q", got.Frames)
	}
	b, err := kvevents.NewDecoder().Decode(got.Frames[2])
	if err != nil || len(b.Events) == 0 || b.Events[len(b.Events)-1].Kind != kvevents.Cleared {
		t.Fatalf("batch %+v, %v: want a clear", b, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("sim: %v", err)
	}
}

// TestSimServesTheLoRAModulesItIsGiven runs `cacheroute sim` with an adapter in each of vLLM's
// --lora-modules forms and reads them back from /v1/models.
func TestSimServesTheLoRAModulesItIsGiven(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port := strconv.Itoa(testkit.FreePort(t))
	done := make(chan error, 1)
	go func() {
		_, _, err := run(ctx, "sim", "--port", port, "--time-scale", "0", "--lora-modules", "sql=/adapters/sql",
			"--lora-modules", `{"name": "chat", "path": "/adapters/chat"}`)
		done <- err
	}()
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for body == "" {
		if resp, err := http.Get("http://127.0.0.1:" + port + "/v1/models"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
		}
		select {
		case err := <-done:
			t.Fatalf("sim ended: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the sim")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, want := range []string{`"id":"sql","object":"model"`, `"root":"/adapters/sql","parent":"sim-model"`, `"id":"chat"`, `"root":"/adapters/chat","parent":"sim-model"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("/v1/models = %s, want %s in it", body, want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("sim: %v", err)
	}
}

func TestSimRefusesAMalformedLoRAModule(t *testing.T) {
	_, _, err := run(context.Background(), "sim", "--port", "0", "--lora-modules", "sql")
	if err == nil || !strings.Contains(err.Error(), "lora module") {
		t.Fatalf("err = %v, want the module refused", err)
	}
}
