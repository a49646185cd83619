package kubeapi

import "testing"

func TestParseSelectorTakesKeyValueTermsOnly(t *testing.T) {
	for in, want := range map[string]string{
		"app=vllm":                     "app=vllm",
		"tier=gpu, app=vllm":           "app=vllm,tier=gpu",
		"example.com/role=worker,a=":   "a=,example.com/role=worker",
		"app=vllm,app=vllm":            "app=vllm",
		"app.kubernetes.io/name=vllm ": "app.kubernetes.io/name=vllm",
	} {
		sel, err := ParseSelector(in)
		if err != nil || sel.String() != want {
			t.Errorf("ParseSelector(%q) = %q, %v; want %q", in, sel.String(), err, want)
		}
	}
	for _, in := range []string{"", " ", "app", "app in (a,b)", "app!=web", "app==vllm", "=vllm", "app=vllm,", "app=a,app=b", "app=(x)"} {
		if sel, err := ParseSelector(in); err == nil {
			t.Errorf("ParseSelector(%q) accepted: %v", in, sel)
		}
	}
}

func TestSelectorMatchesEveryTerm(t *testing.T) {
	sel, err := ParseSelector("app=vllm,tier=gpu")
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(map[string]string{"app": "vllm", "tier": "gpu", "rev": "2"}) {
		t.Error("a pod with every label and more does not match")
	}
	for _, labels := range []map[string]string{nil, {"app": "vllm"}, {"app": "vllm", "tier": "cpu"}} {
		if sel.Matches(labels) {
			t.Errorf("%v matches", labels)
		}
	}
	empty, _ := ParseSelector("canary=")
	if empty.Matches(nil) || !empty.Matches(map[string]string{"canary": ""}) {
		t.Error("a term with an empty value must match the key with an empty value only")
	}
}
