// Package natsqueue implements queue.Queue on NATS JetStream, and holds the
// wire protocol shared with the dispatcher (internal/dispatch).
//
// # Protocol
//
// Requests: one work-queue stream per orchestra (Names.Stream) captures
// "orchestra.<orch>.req.<app>"; each application has a durable pull consumer
// (Names.Consumer) filtered on its subject. A request message carries the
// job body and these headers: Nats-Msg-Id (the job ID, for de-duplication),
// Orch-Job-Id, Orch-App, Orch-Path, Orch-Stream ("1" or "0") and Orch-Reply,
// the core NATS subject on which the submitting gateway instance waits.
//
// Responses flow over core NATS to Orch-Reply. Every response message has
// Orch-Kind and Orch-Attempt (the JetStream delivery count of the attempt
// that produced it):
//
//   - KindAccepted: a dispatcher picked a streamed job up for this attempt.
//     It is sent as a request: the gateway answers AcceptWaiting, or
//     AcceptGone when the reply was already closed; no responders means the
//     gateway instance is not (yet, after a NATS restart) listening. The
//     dispatcher acknowledges the job only after a positive answer, so an
//     answer is never published into the void. A non-streamed job sends no
//     KindAccepted: its final data message is the request instead. The
//     gateway answers every response message that has a reply subject.
//   - KindHeartbeat: the attempt is alive (sent every heartbeat interval).
//   - KindData: Orch-Seq numbers data messages of an attempt from 0. The
//     first one carries Orch-Status and the engine's Content-Type; the last
//     one carries Orch-End: 1. The body is raw engine bytes.
//   - KindDeadLettered: the job was moved to the dead-letter stream.
//
// The gateway keeps only the newest attempt; older attempts' messages are
// ignored. Dispatchers also publish KindHeartbeat on "orchestra.<orch>.hb.<app>"
// while they serve an application, so a gateway can tell a queued job from
// an abandoned one. A gateway cancels a job by publishing its stream
// sequence number (decimal) to "orchestra.<orch>.cancel.<app>".
//
// Answers survive a NATS restart: a dispatcher keeps the data messages of
// an attempt until the gateway confirmed it has them all (the final data
// message is a request, answered AcceptWaiting only when nothing before it
// is missing, else AcceptResend with the first missing Orch-Seq). A gateway
// that sees a gap asks for the missing messages on Names.Resend, and puts
// the answer back in order; duplicates are dropped.
package natsqueue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Header names of the protocol.
const (
	HeaderJobID   = "Orch-Job-Id"
	HeaderApp     = "Orch-App"
	HeaderPath    = "Orch-Path"
	HeaderStream  = "Orch-Stream"
	HeaderReply   = "Orch-Reply"
	HeaderKind    = "Orch-Kind"
	HeaderAttempt = "Orch-Attempt"
	HeaderSeq     = "Orch-Seq"
	HeaderStatus  = "Orch-Status"
	HeaderEnd     = "Orch-End"
	HeaderReason  = "Orch-Reason"
	// HeaderContentType carries the engine's Content-Type on the first data
	// message of an attempt.
	HeaderContentType = "Content-Type"
)

// Response message kinds (values of HeaderKind).
const (
	KindAccepted     = "acc"
	KindHeartbeat    = "hb"
	KindData         = "data"
	KindDeadLettered = "dl"
)

// Answers to a KindAccepted request, and to a final data message sent as a
// request.
const (
	AcceptWaiting = "waiting"
	AcceptGone    = "gone"
	// AcceptResend, followed by a decimal Orch-Seq, answers a final data
	// message when messages of the attempt are missing from that one on:
	// the dispatcher publishes them again and asks again.
	AcceptResend = "resend "
)

// Names derives every subject, stream and consumer name of one orchestra.
type Names struct {
	// Orchestra is the ModelOrchestra name.
	Orchestra string
}

func (n Names) token() string { return strings.ReplaceAll(n.Orchestra, ".", "_") }

// Stream is the work-queue stream holding queued requests.
func (n Names) Stream() string { return "ORCHESTRA_" + strings.ToUpper(n.token()) }

// DeadLetterStream holds requests that exhausted their deliveries.
func (n Names) DeadLetterStream() string { return n.Stream() + "_DLQ" }

// Request is the subject of an application's requests.
func (n Names) Request(app string) string { return "orchestra." + n.token() + ".req." + app }

// RequestWildcard matches every application's requests.
func (n Names) RequestWildcard() string { return "orchestra." + n.token() + ".req.*" }

// DeadLetter is the subject of an application's dead letters.
func (n Names) DeadLetter(app string) string { return "orchestra." + n.token() + ".dlq." + app }

// Consumer is the durable pull consumer of an application.
func (n Names) Consumer(app string) string { return "app-" + app }

// Heartbeat is where dispatchers announce that they serve an application.
func (n Names) Heartbeat(app string) string { return "orchestra." + n.token() + ".hb." + app }

// Resend is where gateways ask for data messages they missed (lost while
// NATS restarted): the payload is "<job stream sequence> <attempt> <first
// missing Orch-Seq>", and the dispatcher serving that attempt publishes its
// data messages from there again.
func (n Names) Resend(app string) string { return "orchestra." + n.token() + ".resend." + app }

// Route is where the dispatchers of an application share their prefix
// routing decisions (internal/dispatch, router.go).
func (n Names) Route(app string) string { return "orchestra." + n.token() + ".route." + app }

// Cancel is where gateways cancel jobs of an application.
func (n Names) Cancel(app string) string { return "orchestra." + n.token() + ".cancel." + app }

// ReplyPrefix is the subject prefix of one gateway instance's replies.
func (n Names) ReplyPrefix(instance string) string {
	return "orchestra." + n.token() + ".rsp." + instance
}

// ValidToken reports whether s can be used as one subject token (an
// application or instance name): non-empty, no dots, wildcards or spaces.
func ValidToken(s string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	if strings.ContainsAny(s, ".*> \t\r\n") {
		return fmt.Errorf("%q must not contain '.', '*', '>' or whitespace", s)
	}
	return nil
}

// StreamSpec describes the streams of one orchestra. Dispatchers provision
// them; gateways only publish into them.
type StreamSpec struct {
	Names
	// Replicas is 1 or 3.
	Replicas int
	// MaxAge drops requests queued longer than this (0: never).
	MaxAge time.Duration
	// MaxBytes and MaxMsgs bound the queue; when full, Submit fails with
	// queue.ErrUnavailable rather than dropping queued requests (-1: unbounded).
	MaxBytes int64
	MaxMsgs  int64
	// Duplicates is the de-duplication window for job IDs.
	Duplicates time.Duration
	// DeadLetterMaxAge is how long dead letters are kept.
	DeadLetterMaxAge time.Duration
}

// ConsumerSpec describes one application's consumer.
type ConsumerSpec struct {
	App string
	// AckWait is how long a delivery may go without an ack or progress
	// before JetStream redelivers it.
	AckWait time.Duration
	// MaxAckPending caps the deliveries of this application awaiting an
	// ack across all dispatchers.
	MaxAckPending int
}

// Provision creates or updates the request stream, the dead-letter stream
// and one durable consumer per application. It is idempotent.
//
// The consumer's own MaxDeliver is unlimited: dispatchers count deliveries
// (NumDelivered) and move a job to the dead-letter stream themselves, so a
// job is never left behind in the stream when its last attempt dies with
// its dispatcher.
func Provision(ctx context.Context, js jetstream.JetStream, s StreamSpec, consumers []ConsumerSpec) error {
	if s.Replicas != 1 && s.Replicas != 3 {
		return fmt.Errorf("stream replicas must be 1 or 3, got %d", s.Replicas)
	}
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        s.Stream(),
		Description: "Model Orchestra requests of " + s.Orchestra,
		Subjects:    []string{s.RequestWildcard(), s.LeaseWildcard()},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    s.Replicas,
		Discard:     jetstream.DiscardNew,
		MaxAge:      s.MaxAge,
		MaxBytes:    orUnlimited(s.MaxBytes),
		MaxMsgs:     orUnlimited(s.MaxMsgs),
		Duplicates:  s.Duplicates,
	})
	if err != nil {
		return fmt.Errorf("provisioning stream %s: %w", s.Stream(), err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        s.DeadLetterStream(),
		Description: "Model Orchestra dead-lettered requests of " + s.Orchestra,
		Subjects:    []string{s.DeadLetter("*")},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    s.Replicas,
		MaxAge:      s.DeadLetterMaxAge,
		Duplicates:  s.Duplicates,
	})
	if err != nil {
		return fmt.Errorf("provisioning stream %s: %w", s.DeadLetterStream(), err)
	}
	for _, c := range consumers {
		// The application's requests, and its lease requests (lease.go):
		// one at a time per dispatcher pull, a held lease unacknowledged
		// until it is returned. The two differ only in what they select.
		for _, k := range []struct{ durable, description, subject string }{
			{s.Consumer(c.App), "requests of application " + c.App, s.Request(c.App)},
			{s.LeaseConsumer(c.App), "engine slot leases of application " + c.App, s.Lease(c.App)},
		} {
			_, err := js.CreateOrUpdateConsumer(ctx, s.Stream(), jetstream.ConsumerConfig{
				Durable:       k.durable,
				Description:   k.description,
				FilterSubject: k.subject,
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       c.AckWait,
				MaxDeliver:    -1,
				MaxAckPending: c.MaxAckPending,
				DeliverPolicy: jetstream.DeliverAllPolicy,
			})
			if err != nil {
				return fmt.Errorf("provisioning consumer %s: %w", k.durable, err)
			}
		}
	}
	return nil
}

func orUnlimited(v int64) int64 {
	if v <= 0 {
		return -1
	}
	return v
}
