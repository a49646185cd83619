package harnesses

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// claudeEnv is Claude Code's environment: the router as its API, a dummy key, and telemetry,
// error reports, the auto-updater and every other call home off.
func (rg *rig) claudeEnv(home string) []string {
	return append(rg.baseEnv(home),
		"ANTHROPIC_BASE_URL="+rg.url,
		"ANTHROPIC_API_KEY=sk-dummy",
		"DISABLE_TELEMETRY=1",
		"DISABLE_ERROR_REPORTING=1",
		"DISABLE_AUTOUPDATER=1",
		"DISABLE_BUG_COMMAND=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
	)
}

// codexConfig is a config.toml with the router as a Responses API provider and every remote
// feature off: update checks, analytics, plugins and apps, web search, websockets.
func codexConfig(routerURL string) string {
	return fmt.Sprintf(`model = %q
model_provider = "cacheroute"
check_for_update_on_startup = false
web_search = "disabled"

[analytics]
enabled = false

[features]
plugins = false
apps = false

[model_providers.cacheroute]
name = "cacheroute"
base_url = "%s/v1"
wire_api = "responses"
env_key = "CACHEROUTE_API_KEY"
supports_websockets = false
`, model, routerURL)
}

// Claude Code, three turns of one conversation (-p, then -p --continue twice), through a router
// in front of four sims.
func TestClaudeCodeSessionStaysOnOneWorkerWithAGrowingCacheHit(t *testing.T) {
	claude := requireCLI(t, claudePackage, claudeVersion, "claude")
	sessionUnderEachPolicy(t, "claude", "/v1/messages", func(t *testing.T, rg *rig, home, project string) []func() {
		env := rg.claudeEnv(home)
		prompts := []string{"say hi", "look at README.md and tell me what this project is", "thanks, summarize that in one line"}
		var turns []func()
		for i, p := range prompts {
			args := []string{"-p", p, "--model", model}
			if i > 0 {
				args = append(args, "--continue")
			}
			turns = append(turns, func() { run(t, project, env, claude, args...) })
		}
		return turns
	})
}

// Codex CLI, `codex exec` then `codex exec resume --last` twice, through a router in front of
// four sims.
func TestCodexExecAndResumeStayOnOneWorkerWithAGrowingCacheHit(t *testing.T) {
	codex := requireCLI(t, codexPackage, codexVersion, "codex")
	sessionUnderEachPolicy(t, "codex", "/v1/responses", func(t *testing.T, rg *rig, home, project string) []func() {
		codexHome := filepath.Join(home, ".codex")
		if err := os.MkdirAll(codexHome, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(codexHome, "config.toml"), []byte(codexConfig(rg.url)), 0o644); err != nil {
			t.Fatal(err)
		}
		env := append(rg.baseEnv(home), "CODEX_HOME="+codexHome, "CACHEROUTE_API_KEY=sk-dummy")
		return []func(){
			func() { run(t, project, env, codex, "exec", "--skip-git-repo-check", "say hi") },
			func() {
				run(t, project, env, codex, "exec", "resume", "--last", "--skip-git-repo-check", "look at README.md and tell me what this project is")
			},
			func() {
				run(t, project, env, codex, "exec", "resume", "--last", "--skip-git-repo-check", "thanks, summarize that in one line")
			},
		}
	})
}
