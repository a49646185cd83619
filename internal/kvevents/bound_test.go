package kvevents

import (
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// A topic of llm-d's form kv@HOST:PORT@MODEL names the worker at HOST:PORT; any other topic names
// none by its form.
func TestLLMDTopicNamesItsWorkersHostAndPort(t *testing.T) {
	for _, c := range []struct {
		topic, hostPort string
		ok              bool
	}{
		{"kv@127.0.0.1:8000@sim-model", "127.0.0.1:8000", true},
		{"kv@[::1]:8000@org/model@v2", "[::1]:8000", true},
		{"kv@127.0.0.1@sim-model", "", false},
		{"kv@:8000@m", "", false},
		{"kv", "", false},
		{"", "", false},
		{"events@127.0.0.1:8000@m", "", false},
	} {
		hp, ok := LLMDTopicHostPort(c.topic)
		if hp != c.hostPort || ok != c.ok {
			t.Errorf("%q: %q, %v; want %q, %v", c.topic, hp, ok, c.hostPort, c.ok)
		}
	}
}

// A bind endpoint is an address to bind: no {host}, a tcp:// scheme and a port; one another
// process holds is not bindable.
func TestBindEndpointIsCheckedAndMustBeBindable(t *testing.T) {
	for _, bad := range []string{"tcp://{host}:5557", "ipc:///tmp/kv", "tcp://127.0.0.1"} {
		if CheckBind(bad) == nil && Bindable(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	held := testkit.Listen(t)
	if err := Bindable("tcp://" + held.Addr().String()); err == nil {
		t.Errorf("a held address is bindable")
	}
	addr := held.Addr().String()
	held.Close()
	if err := CheckBind("tcp://" + addr); err != nil {
		t.Errorf("tcp://%s: %v", addr, err)
	}
	if err := Bindable("tcp://" + addr); err != nil {
		t.Errorf("a free address: %v", err)
	}
}
