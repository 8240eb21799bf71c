package emulators

import (
	"context"
	"fmt"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Handler handles one pulled message and says whether to acknowledge it;
// a message it refuses is redelivered at once.
type Handler func(ctx context.Context, m *pubsubpb.PubsubMessage) bool

// Tap creates the pull subscription sub (an id) on topic (an id) and
// hands every message it receives to f, in the background, until ctx ends.
func (p *PubSub) Tap(ctx context.Context, topic, sub string, f Handler) error {
	if _, err := p.client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: p.SubscriptionName(sub), Topic: p.TopicName(topic), AckDeadlineSeconds: 30,
	}); err != nil {
		return fmt.Errorf("subscribe %s to %s: %w", sub, topic, err)
	}
	go p.Pull(ctx, sub, f)
	return nil
}

// Pull hands the messages of subscription sub (an id or a full name) to f
// until ctx ends, the messages of one pull at once. It pulls with unary
// Pull requests, not a streaming pull: the emulator fails on a streaming
// pull the client resets (its log shows NoSuchMethodError in
// onRstStreamRead) and holds the messages it had sent on that stream until
// their ack deadline passes, so a listener on a stream can miss an event
// for 30 s. The local cloud's own listeners (the event taps, the
// notification configuration) therefore pull, as its Eventarc does.
func (p *PubSub) Pull(ctx context.Context, sub string, f Handler) {
	name := p.SubscriptionName(sub)
	api := p.client.SubscriptionAdminClient
	for ctx.Err() == nil {
		resp, err := api.Pull(ctx, &pubsubpb.PullRequest{Subscription: name, MaxMessages: 100})
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && status.Code(err) != codes.DeadlineExceeded:
			sleep(ctx, time.Second)
			continue
		case len(resp.GetReceivedMessages()) == 0:
			sleep(ctx, 20*time.Millisecond)
			continue
		}
		var (
			mu         sync.Mutex
			ack, retry []string
			wg         sync.WaitGroup
		)
		for _, m := range resp.ReceivedMessages {
			wg.Go(func() {
				ok := f(ctx, m.GetMessage())
				mu.Lock()
				defer mu.Unlock()
				if ok {
					ack = append(ack, m.AckId)
				} else {
					retry = append(retry, m.AckId)
				}
			})
		}
		wg.Wait()
		if len(ack) > 0 {
			_ = api.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: name, AckIds: ack})
		}
		if len(retry) > 0 {
			_ = api.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: name, AckIds: retry, AckDeadlineSeconds: 0})
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
