package workers

import "testing"

// The least loaded candidate is asked, the first of equals; a request for its first base model,
// or for no model, asks that model, one for its adapter asks the adapter and gets its tokens
// under the adapter; any other model is not asked.
func TestTokenizeOnAsksTheLeastLoadedCandidateForItsOwnName(t *testing.T) {
	p := NewPool(Options{})
	var ws []*Worker
	for _, u := range []string{"http://a", "http://b", "http://c"} {
		added, err := p.Add(u)
		if err != nil {
			t.Fatal(err)
		}
		w := added[0]
		w.models.Store(&[]string{"base", "alias"})
		w.adapters.Store(&map[string]string{"sql-lora": "base"})
		ws = append(ws, w)
	}
	ws[0].Reserve()
	ws[1].Reserve()
	ws[0].Reserve()
	if w, _, _, _ := TokenizeOn(ws, "base"); w != ws[2] {
		t.Fatalf("asked %s, want the least loaded, %s", w.Name(), ws[2].Name())
	}
	ws[2].Reserve()
	if w, _, _, _ := TokenizeOn(ws, "base"); w != ws[1] {
		t.Fatalf("asked %s, want the first of the least loaded, %s", w.Name(), ws[1].Name())
	}
	for _, c := range []struct {
		model, ask, lora string
		ok               bool
	}{
		{"base", "base", "", true},
		{"", "base", "", true},
		{"sql-lora", "sql-lora", "sql-lora", true},
		{"alias", "", "", false},
		{"unknown", "", "", false},
	} {
		_, ask, lora, ok := TokenizeOn(ws, c.model)
		if ask != c.ask || lora != c.lora || ok != c.ok {
			t.Errorf("model %q: asked %q for adapter %q (%v), want %q, %q (%v)", c.model, ask, lora, ok, c.ask, c.lora, c.ok)
		}
	}
	empty, _ := p.Add("http://d")
	if _, _, _, ok := TokenizeOn(empty, "base"); ok {
		t.Error("a worker that lists no models was asked")
	}
}
