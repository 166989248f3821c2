package helmreconciler

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// A Helm failure can name every object of a release: its event must still
// be accepted (the API server refuses notes over 1024 bytes and the event
// is lost), cut at a rune and marked as cut.
func TestEventNoteFitsAnEvent(t *testing.T) {
	short := "upgrade of release chaos failed: timed out"
	if got := eventNote(short); got != short {
		t.Errorf("a short message changed: %q", got)
	}
	for _, msg := range []string{
		strings.Repeat("x", 5000),
		strings.Repeat("é", 700), // 1400 bytes, two per rune
		strings.Repeat("x", maxEventNote+1),
	} {
		got := eventNote(msg)
		if len(got) > maxEventNote || !utf8.ValidString(got) || !strings.Contains(got, "status conditions hold the whole message") {
			t.Errorf("eventNote of %d bytes: %d bytes, valid UTF-8 %v: %q…", len(msg), len(got), utf8.ValidString(got), got[:40])
		}
	}
	exact := strings.Repeat("x", maxEventNote)
	if eventNote(exact) != exact {
		t.Error("a message of exactly the limit was cut")
	}
}
