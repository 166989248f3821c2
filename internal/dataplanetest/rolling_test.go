package dataplanetest_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
)

// TestRollingRestartOfTheDispatchersCutsNothing replaces each of two
// dispatchers in turn, as a Deployment's rolling update does (the new one
// ready before the old one gets SIGTERM), under streamed and non-streamed
// load: the old one finishes what it serves, so nothing is cut, lost,
// duplicated or answered with a 5xx.
func TestRollingRestartOfTheDispatchersCutsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a rolling restart under load")
	}
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 40
	simCfg.InterTokenLatency = 15 * time.Millisecond
	s := startStack(t, simCfg, nil)
	ds := []*dataplanetest.Dispatcher{dispatcher(t, s), dispatcher(t, s)}
	rolled := make(chan error, 1)
	rep := chaosLoad(t, s, 96, 16, 42, func() {
		go func() {
			var errs []error
			for i, old := range ds {
				nd, err := s.StartDispatcher() // maxSurge 1: the new pod is ready first
				if err != nil {
					errs = append(errs, err)
					break
				}
				errs = append(errs, old.Stop()) // SIGTERM: a graceful shutdown
				ds[i] = nd
			}
			rolled <- errors.Join(errs...)
		}()
	})
	select {
	case err := <-rolled:
		if err != nil {
			t.Fatalf("rolling the dispatchers: %v", err)
		}
	default:
		t.Fatal("the load ended before the roll did: send more requests")
	}
	t.Logf("dispatchers rolled: %v", rep)
	if rep.lost != 0 || rep.duplicated != 0 || rep.wrong != 0 || rep.serverErrors != 0 || rep.cut != 0 || rep.completed != 96 {
		t.Errorf("completed %d of 96, lost %d, duplicated %d, wrong %d, 5xx %d, cut %d; want all completed and 0 each",
			rep.completed, rep.lost, rep.duplicated, rep.wrong, rep.serverErrors, rep.cut)
	}
}

// TestRollingRestartOfNATSCutsNothing restarts the three nodes of a NATS
// cluster one at a time, each through lame duck mode (the chart's preStop)
// and back on its storage, waiting for JetStream to be current again before
// the next, as a StatefulSet's rolling update with the chart's readiness
// probe does, under load: nothing cut, lost, duplicated or answered 5xx.
func TestRollingRestartOfNATSCutsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a 3-node NATS cluster")
	}
	cl := startCluster(t)
	for _, o := range cl.opts {
		o.LameDuckDuration = 2 * time.Second
		o.LameDuckGracePeriod = 500 * time.Millisecond
	}
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 40
	simCfg.InterTokenLatency = 15 * time.Millisecond
	s := startStack(t, simCfg, func(sc *dataplanetest.StackConfig) {
		sc.NATSURLs = strings.Join(cl.urls, ",")
		sc.Dispatcher = func(d *dispatch.Config) {
			d.AckWait = dispatch.Default().AckWait
			d.Stream.Replicas = 3
		}
	})
	dispatcher(t, s)
	dispatcher(t, s)
	// About 0.65 s a request, 16 at a time: the load lasts longer than the
	// roll (three lame-duck periods of 2 s, restarts and catching up).
	const total = 400
	rolled := make(chan error, 1)
	rep := chaosLoad(t, s, total, 16, 42, func() {
		go func() {
			for i := range cl.nodes {
				cl.nodes[i].LameDuckShutdown() // new clients elsewhere, then the rest moved
				cl.nodes[i].WaitForShutdown()
				n, err := server.NewServer(cl.opts[i])
				if err != nil {
					rolled <- err
					return
				}
				go n.Start()
				if !n.ReadyForConnections(10 * time.Second) {
					rolled <- errors.New("a restarted node did not start")
					return
				}
				t.Cleanup(n.Shutdown)
				cl.nodes[i] = n
				deadline := time.Now().Add(30 * time.Second)
				for !n.JetStreamIsCurrent() || n.Healthz(&server.HealthzOptions{}).Status != "ok" {
					if time.Now().After(deadline) {
						rolled <- errors.New("a restarted node's JetStream did not catch up")
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			rolled <- nil
		}()
	})
	select {
	case err := <-rolled:
		if err != nil {
			t.Fatalf("rolling NATS: %v", err)
		}
	default:
		t.Fatal("the load ended before the roll did: send more requests")
	}
	t.Logf("NATS rolled: %v", rep)
	if rep.lost != 0 || rep.duplicated != 0 || rep.wrong != 0 || rep.serverErrors != 0 || rep.cut != 0 || rep.completed != total {
		t.Errorf("completed %d of %d, lost %d, duplicated %d, wrong %d, 5xx %d, cut %d; want all completed and 0 each",
			rep.completed, total, rep.lost, rep.duplicated, rep.wrong, rep.serverErrors, rep.cut)
	}
}
