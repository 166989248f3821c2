package seatgroup

import (
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

func TestConfigValidate(t *testing.T) {
	seat := sidecarapi.Client{URL: "http://127.0.0.1:8090"}
	members := []Member{{Name: "a", Sidecar: seat}, {Name: "b", Sidecar: seat}}
	if err := Default("g").Validate(members); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []struct {
		name    string
		mut     func(*Config)
		members []Member
		want    []string
	}{
		{
			name: "every invalid field is named at once",
			mut: func(c *Config) {
				c.ActiveSeats, c.MinResidency, c.MaxSwapWait, c.Tick, c.MaxResidentFraction = 0, -time.Second, 0, 0, 1
				c.WakeTimeout, c.SleepTimeout, c.StateTimeout = 0, 0, 0
			},
			members: members,
			want: []string{"activeSeats must be at least 1, got 0", "minResidency must not be negative", "maxSwapWait must be positive",
				"tick must be positive", "maxResidentFraction must be within [0, 1), got 1", "wakeTimeout must be positive", "sleepTimeout must be positive", "stateTimeout must be positive"},
		},
		{
			name:    "as many seats as applications leaves nothing to multiplex",
			mut:     func(c *Config) { c.ActiveSeats = 2 },
			members: members,
			want:    []string{"activeSeats 2 leaves nothing to multiplex among 2 applications"},
		},
		{
			name:    "applications need a unique name, a seat and a sleep level of 1 or 2",
			members: []Member{{Name: "a", Sidecar: seat}, {Name: "a", SleepLevel: 3}, {Sidecar: seat}},
			want:    []string{`application "a" is listed twice`, `application "a" has no sidecar`, "sleep level must be 1 or 2, got 3", "application 2 has no name"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := Default("g")
			if c.mut != nil {
				c.mut(&cfg)
			}
			err := cfg.Validate(c.members)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
