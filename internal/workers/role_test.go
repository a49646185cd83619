package workers

import (
	"testing"
	"time"
)

func TestRolesReadAsTheyAreWrittenAndFilterTheFleet(t *testing.T) {
	for _, r := range []Role{RoleColocated, RolePrefill, RoleDecode} {
		if got, err := ParseRole(r.String()); err != nil || got != r {
			t.Errorf("ParseRole(%q) = %v, %v", r.String(), got, err)
		}
	}
	if r, err := ParseRole(""); err != nil || r != RoleColocated {
		t.Errorf("an empty role reads as %v, %v; want colocated", r, err)
	}
	if _, err := ParseRole("both"); err == nil {
		t.Error("an unknown role was accepted")
	}
	a, b, c := newWorker("http://127.0.0.1:1", -1, 1, nil, &loadConfig{}), newWorker("http://127.0.0.1:2", -1, 1, nil, &loadConfig{}), newWorker("http://127.0.0.1:3", -1, 1, nil, &loadConfig{})
	b.SetRole(RolePrefill)
	c.SetRole(RoleDecode)
	all := []*Worker{a, b, c}
	if got := OfRole(all, RolePrefill); len(got) != 1 || got[0] != b {
		t.Errorf("prefill workers %v, want the one set so", got)
	}
	if got := OfRole(all, RoleColocated); len(got) != 1 || got[0] != a || a.Role() != RoleColocated {
		t.Errorf("colocated workers %v, want the one never set", got)
	}
}

// Prefill and decode engines are scaled apart: a role's own data-parallel size makes that many
// tenants of each of its URLs, each of them in the role, and an engine's figures are split over
// its own ranks.
func TestEachRoleHasItsOwnDataParallelRanks(t *testing.T) {
	p := NewPool(Options{DPSize: 1, RoleDPSize: map[Role]int{RolePrefill: 4, RoleDecode: 2}, LoadSignal: SignalEngine, EngineMaxAge: time.Hour})
	for _, tc := range []struct {
		url   string
		role  Role
		ranks int
	}{
		{"http://127.0.0.1:1", RolePrefill, 4},
		{"http://127.0.0.1:2", RoleDecode, 2},
		{"http://127.0.0.1:3", RoleColocated, 1},
	} {
		ws, err := p.AddAs(tc.url, tc.role)
		if err != nil {
			t.Fatal(err)
		}
		if len(ws) != tc.ranks {
			t.Fatalf("%s worker: %d tenants, want %d", tc.role, len(ws), tc.ranks)
		}
		for i, w := range ws {
			if w.Role() != tc.role || (tc.ranks > 1 && w.Rank() != i) || (tc.ranks == 1 && w.Rank() != -1) {
				t.Errorf("tenant %s: role %s rank %d", w.Name(), w.Role(), w.Rank())
			}
			w.SetEngine(w.BeginScrape(), EngineStats{Running: 4}, true)
		}
		if got := ws[0].Load(); got != int64(4/tc.ranks) {
			t.Errorf("%s worker: rank 0 load %d, want 4 running split over %d ranks", tc.role, got, tc.ranks)
		}
	}
}
