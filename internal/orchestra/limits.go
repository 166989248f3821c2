package orchestra

import (
	"fmt"

	"github.com/model-orchestra/operator/internal/natsqueue"
)

// NATSMaxPayload is the max_payload of the orchestra's NATS server
// (charts/model-orchestra/charts/nats/templates/nats.yaml, "9MB"): the
// largest message NATS carries, headers included. A queued request is one
// message, so the gateway's body limit must leave room for its headers.
const NATSMaxPayload = 9 << 20

// MaxQueuedBodyBytes is the largest request body the queue can carry.
const MaxQueuedBodyBytes = NATSMaxPayload - natsqueue.HeaderReserve

// checkMaxBodySize fails when the gateway would accept bodies that NATS
// cannot carry: they would pass the gateway's size check and then be
// refused by the queue.
func checkMaxBodySize(maxBody int64) error {
	if maxBody > MaxQueuedBodyBytes {
		return fmt.Errorf("spec.gateway.limits.maxBodySize: %d bytes is more than the queue carries: at most %d "+
			"(NATS max_payload of %d bytes minus %d for the request's headers)",
			maxBody, MaxQueuedBodyBytes, NATSMaxPayload, natsqueue.HeaderReserve)
	}
	return nil
}
