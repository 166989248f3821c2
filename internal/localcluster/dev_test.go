package localcluster

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

func TestDownIsIdempotentWithoutACluster(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	for i := range 2 {
		if err := Down(context.Background(), dir); err != nil {
			t.Fatalf("Down #%d on an empty state directory: %v", i+1, err)
		}
	}
	if _, err := ReadDevState(dir); !errors.Is(err, ErrNotRunning) {
		t.Errorf("ReadDevState = %v, want ErrNotRunning", err)
	}
	if _, err := Status(context.Background(), dir); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Status = %v, want ErrNotRunning", err)
	}
}
