package workers

import "testing"

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
	a, b, c := newWorker("http://127.0.0.1:1", -1, nil, &loadConfig{}), newWorker("http://127.0.0.1:2", -1, nil, &loadConfig{}), newWorker("http://127.0.0.1:3", -1, nil, &loadConfig{})
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
