package natsqueue

import "github.com/nats-io/nats.go/jetstream"

// The names of the Batch API's JetStream resources (internal/batch): batch
// lines wait in a stream of their own, and a dispatcher moves them into an
// application's request subject only while the application has spare
// capacity, so interactive requests go first.

// BatchStream is the work-queue stream holding batch lines not yet moved
// into the request stream.
func (n Names) BatchStream() string { return n.Stream() + "_BATCH" }

// BatchLines is the subject of one batch's lines for an application.
func (n Names) BatchLines(app, batchID string) string {
	return "orchestra." + n.token() + ".batch." + app + "." + batchID
}

// BatchLinesOf matches every batch's lines of an application.
func (n Names) BatchLinesOf(app string) string { return n.BatchLines(app, "*") }

// BatchLinesWildcard matches every batch line of the orchestra.
func (n Names) BatchLinesWildcard() string { return "orchestra." + n.token() + ".batch.*.*" }

// BatchConsumer is the durable consumer of an application's batch lines.
func (n Names) BatchConsumer(app string) string { return "batch-" + app }

// BatchesBucket is the key-value bucket of batch objects.
func (n Names) BatchesBucket() string { return n.Stream() + "_BATCHES" }

// BatchResultsBucket is the key-value bucket of batch lines' results.
func (n Names) BatchResultsBucket() string { return n.Stream() + "_BATCH_RESULTS" }

// FilesBucket is the object store of the Files API.
func (n Names) FilesBucket() string { return n.Stream() + "_FILES" }

// Headers of a batch line (on the batch stream, and on the request message
// a dispatcher moves it into).
const (
	HeaderBatch    = "Orch-Batch"
	HeaderLine     = "Orch-Line"
	HeaderCustomID = "Orch-Custom-Id"
)

// JetStream returns the client's JetStream context, for the gateway's
// Files and Batch APIs (internal/batch).
func (c *Client) JetStream() jetstream.JetStream { return c.js }

// WakeProgress is where dispatchers say how far an application's root pods
// are on their way to serving, in a sentence for people (core NATS).
func (n Names) WakeProgress(app string) string { return "orchestra." + n.token() + ".wake." + app }
