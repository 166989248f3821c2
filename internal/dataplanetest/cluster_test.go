package dataplanetest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/natsqueue"
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
func startCluster(t *testing.T) cluster {
	t.Helper()
	ports := freePorts(t, 6)
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[3+i]))
	}
	var nodes []*server.Server
	var urls []string
	var all []*server.Options
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
		all = append(all, opts)
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
	return cluster{nodes: nodes, urls: urls, opts: all}
}

// cluster is a 3-node NATS cluster with JetStream, in the process.
type cluster struct {
	nodes []*server.Server
	urls  []string
	opts  []*server.Options // of each node, to restart it
}

// from lists the servers for a client that should use node i: node i
// first, then the others.
func (c cluster) from(i int) string {
	urls := []string{c.urls[i]}
	for j, u := range c.urls {
		if j != i {
			urls = append(urls, u)
		}
	}
	return strings.Join(urls, ",")
}

// index returns the node named name, or -1.
func (c cluster) index(name string) int {
	for i, n := range c.nodes {
		if n.Name() == name {
			return i
		}
	}
	return -1
}

// leaders returns the nodes leading the request stream and the
// application's consumer, as JetStream reports them (stream and consumer
// info), -1 for one without a leader.
func (c cluster) leaders(ctx context.Context, js jetstream.JetStream) (stream, consumer int, err error) {
	names := natsqueue.Names{Orchestra: dataplanetest.Orchestra}
	st, err := js.Stream(ctx, names.Stream())
	if err != nil {
		return -1, -1, err
	}
	si, err := st.Info(ctx)
	if err != nil {
		return -1, -1, err
	}
	co, err := st.Consumer(ctx, names.Consumer(dataplanetest.App))
	if err != nil {
		return -1, -1, err
	}
	ci, err := co.Info(ctx)
	if err != nil {
		return -1, -1, err
	}
	if si.Cluster == nil || ci.Cluster == nil {
		return -1, -1, errors.New("stream or consumer info without cluster")
	}
	return c.index(si.Cluster.Leader), c.index(ci.Cluster.Leader), nil
}

// moveLeaders makes node to the leader of the request stream and of the
// application's consumer, asking the current leaders to step down in its
// favour (JetStream's leader stepdown with a preferred server).
func (c cluster) moveLeaders(t *testing.T, nc *nats.Conn, to int) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := natsqueue.Names{Orchestra: dataplanetest.Orchestra}
	stepdown, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": c.nodes[to].Name()}})
	eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		stream, consumer, err := c.leaders(ctx, js)
		if err != nil {
			return err
		}
		if stream == to && consumer == to {
			return nil
		}
		subject := "$JS.API.STREAM.LEADER.STEPDOWN." + names.Stream()
		if stream == to {
			subject = "$JS.API.CONSUMER.LEADER.STEPDOWN." + names.Stream() + "." + names.Consumer(dataplanetest.App)
		}
		if _, err := nc.Request(subject, stepdown, 2*time.Second); err != nil {
			return fmt.Errorf("asking for a leader stepdown: %w", err)
		}
		time.Sleep(200 * time.Millisecond) // let the election end before asking again
		return fmt.Errorf("stream led by node %d, consumer by node %d, want node %d", stream, consumer, to)
	})
}

// clientsOn returns the nodes where connections named name are.
func (c cluster) clientsOn(t *testing.T, name string) []int {
	t.Helper()
	var on []int
	for i, n := range c.nodes {
		cz, err := n.Connz(&server.ConnzOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ci := range cz.Conns {
			if ci.Name == name {
				on = append(on, i)
			}
		}
	}
	return on
}

// TestStreamsSurviveTheLossOfOneOfThreeNATSNodes: with a 3-node cluster
// and replicated streams, losing any one node cuts no stream, loses and
// duplicates no request, and every answer is the engine's, word for word:
// whichever role the lost node had. The clients are placed on chosen nodes,
// and the stream's and its consumer's leaders moved to a chosen node, so
// that each case loses exactly one role.
func TestStreamsSurviveTheLossOfOneOfThreeNATSNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 3-node NATS clusters")
	}
	cases := []struct {
		name string
		// The nodes of the gateway's connection, of the dispatchers'
		// connections, of the stream's and consumer's leader; the node lost.
		gateway, dispatchers, leader, lost int
	}{
		{name: "the stream's and its consumer's leader, which no client uses", gateway: 1, dispatchers: 2, leader: 0, lost: 0},
		{name: "the gateway's server, not a leader", gateway: 0, dispatchers: 2, leader: 1, lost: 0},
		{name: "the dispatchers' server, not a leader", gateway: 1, dispatchers: 0, leader: 2, lost: 0},
		{name: "a server no client uses, not a leader", gateway: 1, dispatchers: 2, leader: 1, lost: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cl := startCluster(t)
			simCfg := dataplanetest.FastSim()
			simCfg.OutputTokens = 40
			simCfg.InterTokenLatency = 15 * time.Millisecond
			s := startStack(t, simCfg, func(sc *dataplanetest.StackConfig) {
				sc.NATSURLs = strings.Join(cl.urls, ",")
				sc.GatewayNATS = cl.from(c.gateway)
				sc.DispatcherNATS = cl.from(c.dispatchers)
				sc.Dispatcher = func(d *dispatch.Config) {
					d.AckWait = dispatch.Default().AckWait
					d.Stream.Replicas = 3
				}
			})
			dispatcher(t, s)
			dispatcher(t, s)
			nc, err := nats.Connect(cl.urls[c.leader])
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			cl.moveLeaders(t, nc, c.leader)
			nc.Close()
			// The case is what it says: each role on its node.
			if on := cl.clientsOn(t, dataplanetest.GatewayConnName); !slices.Equal(on, []int{c.gateway}) {
				t.Fatalf("gateway connected to nodes %v, want [%d]", on, c.gateway)
			}
			if on := cl.clientsOn(t, dataplanetest.DispatcherConnName); !slices.Equal(on, []int{c.dispatchers, c.dispatchers}) {
				t.Fatalf("dispatchers connected to nodes %v, want [%d %d]", on, c.dispatchers, c.dispatchers)
			}
			rep := chaosLoad(t, s, 48, 16, 42, func() { cl.nodes[c.lost].Shutdown() })
			t.Logf("node %d of 3 lost: %v", c.lost, rep)
			if rep.lost != 0 || rep.duplicated != 0 || rep.wrong != 0 || rep.serverErrors != 0 || rep.cut != 0 {
				t.Errorf("lost %d, duplicated %d, wrong %d, 5xx %d, cut %d; want 0 each",
					rep.lost, rep.duplicated, rep.wrong, rep.serverErrors, rep.cut)
			}
			if rep.completed != 48 {
				t.Errorf("%d of 48 requests completed", rep.completed)
			}
			if rep.recovery > 5*time.Second {
				t.Errorf("recovery took %v, want at most 5s", rep.recovery)
			}
		})
	}
}
