package cli

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestSysmonSettingJoinsTheOperatorsGODEBUG(t *testing.T) {
	cases := []struct {
		env     []string
		godebug string // GODEBUG afterwards, "" when absent
		changed bool
	}{
		{[]string{"PATH=/bin"}, sysmonAwake, true},
		{[]string{"GODEBUG="}, sysmonAwake, true},
		{[]string{"GODEBUG=madvdontneed=1", "PATH=/bin"}, "madvdontneed=1," + sysmonAwake, true},
		{[]string{"GODEBUG=schedtrace=0"}, "schedtrace=0", false},
		{[]string{"GODEBUG=gctrace=1,schedtrace=1000"}, "gctrace=1,schedtrace=1000", false},
	}
	for _, c := range cases {
		env := slices.Clone(c.env)
		got, changed := withSysmonAwake(env)
		if changed != c.changed || godebugOf(got) != c.godebug {
			t.Errorf("withSysmonAwake(%q) = %q, %v; want GODEBUG %q, %v", c.env, got, changed, c.godebug, c.changed)
		}
		if !slices.Equal(env, c.env) {
			t.Errorf("withSysmonAwake changed its argument to %q", env)
		}
		if len(got) != len(c.env) && len(got) != len(c.env)+1 {
			t.Errorf("withSysmonAwake(%q) = %q: other variables lost or repeated", c.env, got)
		}
	}
}

func godebugOf(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			return v
		}
	}
	return ""
}

// sysmonChildEnv makes the test binary, started with it set, run keepSysmonAwake and print its
// process id and GODEBUG instead of the tests.
const sysmonChildEnv = "CACHEROUTE_TEST_SYSMON_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(sysmonChildEnv) != "" {
		keepSysmonAwake()
		fmt.Printf("%d %s\n", os.Getpid(), os.Getenv("GODEBUG"))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestTheProgramRunsAgainInPlaceWithTheSysmonSetting(t *testing.T) {
	for _, godebug := range []string{"", "gctrace=0", "schedtrace=0"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GODEBUG=") }),
			sysmonChildEnv+"=1")
		if godebug != "" {
			cmd.Env = append(cmd.Env, "GODEBUG="+godebug)
		}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("GODEBUG=%q: %v", godebug, err)
		}
		var pid int
		var got string
		if _, err := fmt.Sscanf(string(out), "%d %s", &pid, &got); err != nil {
			t.Fatalf("GODEBUG=%q: child printed %q: %v", godebug, out, err)
		}
		want := map[string]string{"": sysmonAwake, "gctrace=0": "gctrace=0," + sysmonAwake, "schedtrace=0": "schedtrace=0"}[godebug]
		if got != want {
			t.Errorf("GODEBUG=%q: the program ran with GODEBUG=%q, want %q", godebug, got, want)
		}
		if pid != cmd.Process.Pid {
			t.Errorf("GODEBUG=%q: the program ran as process %d, not in place of %d", godebug, pid, cmd.Process.Pid)
		}
	}
}
