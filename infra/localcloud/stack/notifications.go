package stack

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/raydrop/raydrop/pkg/names"
)

// markNotifications stands for the checkpoint buckets' Cloud Storage
// notification configuration (infra/gcp: google_storage_notification.marks):
// object finalizations whose name starts with names.NoticePrefix, published
// to the marks topic with Cloud Storage's payload and attributes.
// fake-gcs-server has one notification topic for every bucket and no
// prefix filter, so this reads that topic and forwards exactly what the
// configuration would publish; everything else (checkpoint files, the
// intake bucket's objects) is not forwarded.
// https://cloud.google.com/storage/docs/pubsub-notifications
func (s *Stack) markNotifications(ctx context.Context) error {
	sub := s.PubSub.SubscriptionName("notification-config-marks")
	if _, err := s.PS.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: sub, Topic: s.PubSub.TopicName(NotifyTopic), AckDeadlineSeconds: 30,
	}); err != nil {
		return fmt.Errorf("notification config of the checkpoint buckets: %w", err)
	}
	pub := s.PS.Publisher(Topics.Marks)
	pub.PublishSettings.DelayThreshold = 0
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer pub.Stop()
		s.PubSub.Pull(ctx, sub, func(ctx context.Context, m *pubsubpb.PubsubMessage) bool {
			a := m.Attributes
			if a["eventType"] != "OBJECT_FINALIZE" || !slices.Contains(s.opts.OutputBuckets, a["bucketId"]) || !strings.HasPrefix(a["objectId"], names.NoticePrefix) {
				return true
			}
			attrs := map[string]string{"notificationConfig": "projects/_/buckets/" + a["bucketId"] + "/notificationConfigs/marks"}
			for k, v := range a {
				attrs[k] = v
			}
			// Cloud Storage retries a notification it could not publish.
			_, err := pub.Publish(ctx, &pubsub.Message{Data: m.Data, Attributes: attrs}).Get(ctx)
			return err == nil
		})
	}()
	return nil
}
