package dataplanetest_test

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
)

// freePorts returns n free loopback ports.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		defer func() { _ = l.Close() }()
	}
	return ports
}

// startCluster starts a 3-node NATS cluster with JetStream in the process.
func startCluster(t *testing.T) ([]*server.Server, string) {
	t.Helper()
	ports := freePorts(t, 6)
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3+i]))
	}
	var nodes []*server.Server
	var urls []string
	for i := range 3 {
		dir, err := os.MkdirTemp("", "orchestra-nats-cluster-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       ports[i],
			JetStream:  true,
			StoreDir:   dir,
			MaxPayload: 9 << 20,
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "orchestra", Host: "127.0.0.1", Port: ports[3+i]},
			Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("a cluster node did not start")
		}
		t.Cleanup(s.Shutdown)
		nodes = append(nodes, s)
		urls = append(urls, s.ClientURL())
	}
	eventually(t, 30*time.Second, holds("a JetStream meta leader", func() bool {
		for _, n := range nodes {
			if n.JetStreamIsLeader() {
				return true
			}
		}
		return false
	}))
	return nodes, strings.Join(urls, ",")
}

// TestStreamsSurviveTheLossOfOneOfThreeNATSNodes: with a 3-node cluster
// and replicated streams, losing any one node cuts no stream and loses no
// request.
func TestStreamsSurviveTheLossOfOneOfThreeNATSNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster")
	}
	nodes, urls := startCluster(t)
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 40
	simCfg.InterTokenLatency = 15 * time.Millisecond
	s := startStack(t, simCfg, func(sc *dataplanetest.StackConfig) {
		sc.NATSURLs = urls
		sc.Dispatcher = func(d *dispatch.Config) {
			d.AckWait = dispatch.Default().AckWait
			d.Stream.Replicas = 3
		}
	})
	dispatcher(t, s)
	dispatcher(t, s)
	// Clients pick a server at random: the lost node serves some of them.
	rep := chaosLoad(t, s, 48, 16, 42, func() { nodes[0].Shutdown() })
	t.Logf("one node of 3 lost: %v", rep)
	if rep.lost != 0 || rep.duplicated != 0 || rep.serverErrors != 0 || rep.cut != 0 {
		t.Errorf("lost %d, duplicated %d, 5xx %d, cut %d; want 0 each", rep.lost, rep.duplicated, rep.serverErrors, rep.cut)
	}
	if rep.recovery > 5*time.Second {
		t.Errorf("recovery took %v, want at most 5s", rep.recovery)
	}
}
