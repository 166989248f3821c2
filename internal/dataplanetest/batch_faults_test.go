package dataplanetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
)

// TestBatchSurvivesFaults kills a gateway, a dispatcher, or NATS while a
// batch runs: the batch completes with exactly one successful answer per
// line (0 lost, 0 duplicated in its output).
func TestBatchSurvivesFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the in-process data plane")
	}
	const n = 80
	simCfg := dataplanetest.FastSim()
	simCfg.InterTokenLatency = 5 * time.Millisecond // a line takes about 50 ms
	stack := func(t *testing.T, noDriver bool) *dataplanetest.Stack {
		return startStack(t, simCfg, func(c *dataplanetest.StackConfig) {
			c.NoBatchDriver = noDriver
			c.Dispatcher = func(d *dispatch.Config) { d.Apps[0].MaxConcurrency = 4 }
		})
	}
	client := func(url string) openai.Client {
		return openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey(dataplanetest.APIKey), option.WithMaxRetries(5))
	}
	// waitDone waits until the batch counts at least done finished lines.
	waitDone := func(t *testing.T, ctx context.Context, c openai.Client, id string, done int64) {
		t.Helper()
		var last openai.BatchRequestCounts
		eventually(t, 30*time.Second, func() error {
			b, err := c.Batches.Get(ctx, id)
			if err == nil {
				last = b.RequestCounts
			}
			return holds("lines to finish", func() bool { return last.Completed+last.Failed >= done })()
		})
	}
	finish := func(t *testing.T, ctx context.Context, c openai.Client, s *dataplanetest.Stack, id string) {
		t.Helper()
		b := waitBatch(t, ctx, c, id, openai.BatchStatusCompleted, 60*time.Second)
		checkComplete(t, ctx, c, b, n)
		t.Logf("the engine received %d requests for %d lines (runs a client cannot see: %d)",
			s.Engine.Requests.Load(), n, s.Engine.Requests.Load()-n)
	}

	t.Run("gateway", func(t *testing.T) {
		s := stack(t, true)
		dispatcher(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		gw, err := s.StartGatewayProcess()
		if err != nil {
			t.Fatal(err)
		}
		c := client(gw.Server.URL)
		// Killed at once: its driver was putting the lines on the stream.
		b := newBatch(t, ctx, c, uploadBatchFile(t, ctx, c, batchInput(simCfg.Model, n, 10)).ID)
		gw.Kill()
		gw2, err := s.StartGatewayProcess()
		if err != nil {
			t.Fatal(err)
		}
		c2 := client(gw2.Server.URL)
		waitDone(t, ctx, c2, b.ID, n/4)
		// Killed while the lines run; a third gateway finishes the batch.
		gw2.Kill()
		gw3, err := s.StartGatewayProcess()
		if err != nil {
			t.Fatal(err)
		}
		finish(t, ctx, client(gw3.Server.URL), s, b.ID)
	})

	t.Run("dispatcher", func(t *testing.T) {
		s := stack(t, false)
		d1 := dispatcher(t, s)
		dispatcher(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		c := client(s.Gateway.URL)
		b := newBatch(t, ctx, c, uploadBatchFile(t, ctx, c, batchInput(simCfg.Model, n, 10)).ID)
		waitDone(t, ctx, c, b.ID, n/4)
		d1.Kill()
		finish(t, ctx, c, s, b.ID)
	})

	t.Run("nats", func(t *testing.T) {
		s := stack(t, false)
		dispatcher(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		c := client(s.Gateway.URL)
		b := newBatch(t, ctx, c, uploadBatchFile(t, ctx, c, batchInput(simCfg.Model, n, 10)).ID)
		waitDone(t, ctx, c, b.ID, n/4)
		if err := s.RestartNATS(); err != nil {
			t.Fatal(err)
		}
		finish(t, ctx, c, s, b.ID)
	})
}
