package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-router/sluice/internal/config"
)

// `sluice serve` persists the averages by default (the seed's second
// rule): with stats.store unset they go to stats.db in the state
// directory, which is made; an explicit store or memory is kept as given.
func TestLoadServeConfig_PersistsByDefault(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	t.Setenv("SLUICE_STATE_DIR", state)
	write := func(extra string) string {
		p := filepath.Join(t.TempDir(), "sluice.yaml")
		if err := os.WriteFile(p, []byte("workers:\n  - {name: a, url: \"http://127.0.0.1:1\"}\n"+extra), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	own := filepath.Join(t.TempDir(), "own.db")
	tests := []struct {
		name, extra, want string
	}{
		{"unset: the state directory", "", filepath.Join(state, "stats.db")},
		{"a file", "stats: {store: " + own + "}\n", own},
		{"memory, when asked", "stats: {store: memory}\n", config.StatsMemory},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := loadServeConfig(write(tt.extra), "", "")
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Stats.Store != tt.want {
				t.Fatalf("stats.store %q, want %q", cfg.Stats.Store, tt.want)
			}
		})
	}
	if fi, err := os.Stat(state); err != nil || !fi.IsDir() {
		t.Fatalf("the default state directory was not made: %v", err)
	}
}

func TestDefaultStatsStore_FollowsXDGThenHome(t *testing.T) {
	t.Setenv("SLUICE_STATE_DIR", "")
	t.Setenv("XDG_STATE_HOME", "/x/state")
	if got, _ := config.DefaultStatsStore(); got != "/x/state/sluice/stats.db" {
		t.Fatalf("with XDG_STATE_HOME: %q", got)
	}
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/home/u")
	if got, _ := config.DefaultStatsStore(); got != "/home/u/.local/state/sluice/stats.db" {
		t.Fatalf("with HOME only: %q", got)
	}
}
