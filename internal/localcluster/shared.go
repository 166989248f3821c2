package localcluster

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
)

// Shared is the one control plane of a test package whose tests each work
// in their own namespace: Get starts it on first use, so that the
// package's tests that need no cluster run without one, and Run stops it
// after the package's tests. Declare it as a package variable and call Run
// from TestMain:
//
//	var cluster = localcluster.Shared{Options: localcluster.Options{ControllerManager: true}}
//
//	func TestMain(m *testing.M) { os.Exit(cluster.Run(m)) }
type Shared struct {
	Options Options
	// Setup, if set, runs once after the start (clients, CRDs); its error,
	// like the start's, fails every Get.
	Setup func(*Cluster) error

	once sync.Once
	c    *Cluster
	err  error
}

// Get returns the package's cluster, starting it (and running Setup) on
// first use. It skips t under -short (SkipUnderShort) and fails t when the
// cluster could not start or be set up.
func (s *Shared) Get(t testing.TB) *Cluster {
	t.Helper()
	SkipUnderShort(t)
	s.once.Do(func() {
		if s.c, s.err = Start(context.Background(), s.Options); s.err != nil {
			s.err = fmt.Errorf("starting: %w", s.err)
			return
		}
		if s.Setup != nil {
			s.err = s.Setup(s.c)
		}
	})
	if s.err != nil {
		t.Fatalf("local control plane: %v", s.err)
	}
	return s.c
}

// Run runs the package's tests, then stops the cluster if a test started
// one. It returns the exit code for os.Exit: m.Run's, or 1 when the stop
// failed.
func (s *Shared) Run(m *testing.M) int {
	code := m.Run()
	if s.c != nil {
		if err := s.c.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the local control plane: %v\n", err)
			code = 1
		}
	}
	return code
}
