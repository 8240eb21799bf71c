package eventarc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Subscriber is the part of Pub/Sub's subscriber API a pulling route uses
// (the v2 client's SubscriptionAdminClient).
type Subscriber interface {
	Pull(ctx context.Context, req *pubsubpb.PullRequest, opts ...gax.CallOption) (*pubsubpb.PullResponse, error)
	Acknowledge(ctx context.Context, req *pubsubpb.AcknowledgeRequest, opts ...gax.CallOption) error
	ModifyAckDeadline(ctx context.Context, req *pubsubpb.ModifyAckDeadlineRequest, opts ...gax.CallOption) error
}

// Policy is how a trigger's subscription delivers: what Eventarc's push
// subscription and the Cloud Run service behind it do in the cloud.
type Policy struct {
	// Concurrency is how many deliveries may be in flight at once: the
	// function's maximum instances times the requests one instance serves
	// (max_instance_count × max_instance_request_concurrency in
	// infra/gcp/functions.tf). Cloud Run sends an instance at most that
	// many requests and scales out to the maximum instances:
	// https://cloud.google.com/run/docs/about-concurrency.
	Concurrency int
	// AckDeadline is the subscription's acknowledgement deadline, which is
	// also how long a push waits for the function's answer:
	// https://cloud.google.com/pubsub/docs/push#receive_push.
	AckDeadline time.Duration
	// MinBackoff and MaxBackoff are the subscription's retry policy: a
	// message the function failed is redelivered after an exponential
	// back-off between them:
	// https://cloud.google.com/pubsub/docs/handling-failures#exponential_backoff.
	MinBackoff, MaxBackoff time.Duration
	// MaxDeliveryAttempts is the dead-letter policy: the delivery after
	// which a failed message is forwarded to DeadLetterTopic and
	// acknowledged, with the attributes Pub/Sub adds:
	// https://cloud.google.com/pubsub/docs/handling-failures#dead_letter_topic.
	MaxDeliveryAttempts int
	DeadLetterTopic     string
}

// backoff is the wait before the redelivery that follows the n-th failed
// delivery (n from 1): MinBackoff doubled for each earlier failure, at most
// MaxBackoff.
func (p Policy) backoff(n int) time.Duration {
	d := p.MinBackoff
	for i := 1; i < n && d < p.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, p.MaxBackoff)
}

// DeadLetter publishes a message to a dead-letter topic.
type DeadLetter func(ctx context.Context, topic string, m *pubsubpb.PubsubMessage) error

// idlePause is how long a pulling route waits after a pull that returned
// nothing before it pulls again.
const idlePause = 20 * time.Millisecond

// Receive delivers route's messages from the pull subscription (its full
// name) until ctx ends, as Eventarc delivers a trigger's messages in the
// cloud: up to pol.Concurrency at once, each as a CloudEvent to the
// function (the same event and binary content mode as a push), an answer
// other than 2xx (or none within the ack deadline) redelivered after the
// retry policy's back-off, and a message that failed MaxDeliveryAttempts
// times forwarded to the dead-letter topic.
//
// The subscription has no retry or dead-letter policy of its own: Receive
// applies them, so that redeliveries follow the deployment's policy
// whatever the emulator does with a pull subscription's policies.
func (a *Adapter) Receive(ctx context.Context, route, subscription string, pol Policy, sub Subscriber, dead DeadLetter) error {
	if _, ok := a.routes[route]; !ok {
		return fmt.Errorf("receive: unknown route %q", route)
	}
	if pol.Concurrency < 1 || pol.MaxDeliveryAttempts < 1 || pol.AckDeadline <= 0 || pol.DeadLetterTopic == "" {
		return fmt.Errorf("receive %s: a policy with concurrency, ack deadline, max delivery attempts and dead-letter topic is required: %+v", route, pol)
	}
	r := &receiver{a: a, route: route, sub: subscription, pol: pol, api: sub, dead: dead, attempts: map[string]int{}}
	slots := make(chan struct{}, pol.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		// Wait for a free slot, then take every free slot for one pull.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		n := 1
		for n < min(pol.Concurrency, 1000) {
			select {
			case slots <- struct{}{}:
				n++
				continue
			default:
			}
			break
		}
		resp, err := sub.Pull(ctx, &pubsubpb.PullRequest{Subscription: subscription, MaxMessages: int32(n)})
		got := 0
		if err == nil {
			got = len(resp.ReceivedMessages)
		}
		for range n - got {
			<-slots
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && status.Code(err) != codes.DeadlineExceeded:
			a.log.Warn("eventarc: pull failed", "route", route, "err", err)
			pause(ctx, time.Second)
			continue
		case got == 0:
			pause(ctx, idlePause)
			continue
		}
		for _, m := range resp.ReceivedMessages {
			wg.Go(func() {
				defer func() { <-slots }()
				r.deliver(ctx, m)
			})
		}
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// receiver is one route's pulling.
type receiver struct {
	a          *Adapter
	route, sub string
	pol        Policy
	api        Subscriber
	dead       DeadLetter
	mu         sync.Mutex
	attempts   map[string]int // failed deliveries so far, by message id
}

// deliver delivers one pulled message and settles it.
func (r *receiver) deliver(ctx context.Context, m *pubsubpb.ReceivedMessage) {
	msg := m.GetMessage()
	p := pushRequest{Subscription: r.sub, Message: pushedMessage{
		Data: msg.GetData(), Attributes: msg.GetAttributes(), MessageID: msg.GetMessageId(), OrderingKey: msg.GetOrderingKey(),
	}}
	if t := msg.GetPublishTime(); t != nil {
		p.Message.PublishTime = t.AsTime().UTC().Format(time.RFC3339Nano)
	}
	// A push waits for the function's answer until the ack deadline.
	dctx, cancel := context.WithTimeout(ctx, r.pol.AckDeadline)
	code, _ := r.a.handle(dctx, r.route, p)
	cancel()
	if ctx.Err() != nil {
		return // shutting down: the message is redelivered to whoever pulls next
	}
	if code >= 200 && code < 300 {
		r.settle(ctx, m, 0)
		return
	}
	r.mu.Lock()
	r.attempts[msg.GetMessageId()]++
	n := r.attempts[msg.GetMessageId()]
	r.mu.Unlock()
	if n < r.pol.MaxDeliveryAttempts {
		r.settle(ctx, m, r.pol.backoff(n))
		return
	}
	fwd := &pubsubpb.PubsubMessage{Data: msg.GetData(), Attributes: map[string]string{}, OrderingKey: msg.GetOrderingKey()}
	for k, v := range msg.GetAttributes() {
		fwd.Attributes[k] = v
	}
	fwd.Attributes["CloudPubSubDeadLetterSourceSubscription"] = r.sub
	fwd.Attributes["CloudPubSubDeadLetterSourceDeliveryCount"] = strconv.Itoa(n)
	if p.Message.PublishTime != "" {
		fwd.Attributes["CloudPubSubDeadLetterSourceTopicPublishTime"] = p.Message.PublishTime
	}
	if err := r.dead(ctx, r.pol.DeadLetterTopic, fwd); err != nil {
		r.a.log.Error("eventarc: dead-lettering failed; the message will be redelivered", "route", r.route, "id", msg.GetMessageId(), "err", err)
		r.settle(ctx, m, r.pol.MaxBackoff)
		return
	}
	r.a.log.Warn("eventarc: message dead-lettered", "route", r.route, "id", msg.GetMessageId(), "attempts", n, "topic", r.pol.DeadLetterTopic)
	r.settle(ctx, m, 0)
}

// settle acknowledges a message (after 0) or has it redelivered after the
// wait, by setting its ack deadline to the wait.
func (r *receiver) settle(ctx context.Context, m *pubsubpb.ReceivedMessage, after time.Duration) {
	var err error
	if after == 0 {
		r.mu.Lock()
		delete(r.attempts, m.GetMessage().GetMessageId())
		r.mu.Unlock()
		err = r.api.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: r.sub, AckIds: []string{m.GetAckId()}})
	} else {
		secs := int32((after + time.Second - 1) / time.Second)
		err = r.api.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: r.sub, AckIds: []string{m.GetAckId()}, AckDeadlineSeconds: secs})
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		r.a.log.Warn("eventarc: settling a message failed; it will be redelivered at its ack deadline", "route", r.route, "id", m.GetMessage().GetMessageId(), "err", err)
	}
}
