package agent

import (
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("default sidecar config: %v", err)
	}
	node := Default()
	node.Role = RoleNode
	if err := node.Validate(); err != nil {
		t.Fatalf("default node config: %v", err)
	}
	for name, c := range map[string]struct {
		mut  func(*Config)
		want string
	}{
		"role":      {func(c *Config) { c.Role = "both" }, `role must be sidecar or node, got "both"`},
		"dllama":    {func(c *Config) { c.Sidecar.Engine.Kind = "dllama" }, "runtime.engine is dllama"},
		"url":       {func(c *Config) { c.Sidecar.Engine.URL = "localhost:8000" }, "must be an http(s) URL"},
		"level":     {func(c *Config) { c.Sidecar.SleepLevel = 3 }, "sleep level must be 1 or 2"},
		"drain":     {func(c *Config) { c.Sidecar.DrainTimeout = 0 }, "drain timeout must be positive"},
		"same dirs": {func(c *Config) { c.Role = RoleNode; c.Node.Store.WarmDir = c.Node.Store.HotDir }, "must differ"},
		"budget":    {func(c *Config) { c.Role = RoleNode; c.Node.Store.Budgets.Hot = -1 }, "budgets must not be negative"},
	} {
		cfg := Default()
		c.mut(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}
