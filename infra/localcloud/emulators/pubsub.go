// Package emulators runs the Google Cloud emulators of the local cloud as
// child processes bound to 127.0.0.1: the Pub/Sub emulator of the Cloud SDK
// and fake-gcs-server for Cloud Storage, which publishes the bucket
// notifications to the Pub/Sub emulator. It also creates on the emulator the
// topics and push subscriptions that the deployment creates in the cloud.
//
// Every emulator runs in a process group of its own; Stop kills the group
// and waits, so its ports are free when Stop returns. On Linux the kernel
// also kills an emulator when the thread that started it dies, so a crashed
// test or local cloud leaves nothing running.
package emulators

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// PubSubJarEnv names the environment variable that, when set, gives the
// Pub/Sub emulator's jar instead of the one found in the Cloud SDK.
const PubSubJarEnv = "RAYDROP_PUBSUB_EMULATOR_JAR"

// PubSub is a running Pub/Sub emulator.
type PubSub struct {
	// Host is the emulator's address, 127.0.0.1:port, the value of
	// PUBSUB_EMULATOR_HOST for the clients that use it.
	Host string
	// Project is the project the topics and subscriptions are created in.
	Project string

	proc   *child
	client *pubsub.Client

	stopOnce sync.Once
	stopErr  error

	mu           sync.Mutex
	deadLettered map[string]int // trigger name -> messages dead-lettered so far
	deadMessages map[string][]*pubsubpb.PubsubMessage
}

// StartPubSub starts the Pub/Sub emulator on a free port of 127.0.0.1 and
// returns once it serves. Its output goes to logDir/pubsub-emulator.log
// (discarded when logDir is empty). It takes about 2.5 s.
func StartPubSub(ctx context.Context, project string, logDir string) (*PubSub, error) {
	if project == "" {
		return nil, errors.New("pubsub emulator: empty project")
	}
	java, err := javaBinary()
	if err != nil {
		return nil, err
	}
	jar, err := pubsubJar()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ { // the second attempt covers a lost race for the port
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		ready := make(chan struct{})
		var once sync.Once
		argv := []string{java,
			// A small heap and the C1 compiler only: about a second faster to start.
			"-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
			"-jar", jar, "--host=127.0.0.1", "--port=" + strconv.Itoa(port)}
		proc, err := startChild("pubsub-emulator", logDir, argv, nil, func(line string) {
			if strings.Contains(line, "Server started") {
				once.Do(func() { close(ready) })
			}
		})
		if err != nil {
			return nil, err
		}
		err = waitReady(ctx, proc, ready, 60*time.Second)
		if err == nil {
			p := &PubSub{
				Host:         "127.0.0.1:" + strconv.Itoa(port),
				Project:      project,
				proc:         proc,
				deadLettered: map[string]int{},
				deadMessages: map[string][]*pubsubpb.PubsubMessage{},
			}
			if p.client, err = p.NewClient(context.WithoutCancel(ctx)); err != nil {
				_ = proc.stop()
				return nil, err
			}
			return p, nil
		}
		_ = proc.stop()
		lastErr = fmt.Errorf("pubsub emulator on port %d: %w\n%s", port, err, proc.tail())
		if !errors.Is(err, errExited) {
			break
		}
	}
	return nil, lastErr
}

// Stop kills the emulator and waits for it to exit; its port is free when
// Stop returns. Stop may be called more than once.
func (p *PubSub) Stop() error {
	p.stopOnce.Do(func() {
		var errs []error
		if err := p.client.Close(); err != nil && status.Code(err) != codes.Canceled {
			errs = append(errs, err)
		}
		errs = append(errs, p.proc.stop())
		p.stopErr = errors.Join(errs...)
	})
	return p.stopErr
}

// Env is the environment a client of this emulator needs.
func (p *PubSub) Env() []string {
	return []string{"PUBSUB_EMULATOR_HOST=" + p.Host}
}

// NewClient returns a client of the emulator for the emulator's project; the
// caller closes it.
func (p *PubSub) NewClient(ctx context.Context) (*pubsub.Client, error) {
	return pubsub.NewClient(ctx, p.Project,
		option.WithEndpoint(p.Host),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithTelemetryDisabled(),
	)
}

// TopicName is the full name, projects/<project>/topics/<id>, of a topic
// id; a full name is returned as it is.
func (p *PubSub) TopicName(id string) string {
	if strings.HasPrefix(id, "projects/") {
		return id
	}
	return "projects/" + p.Project + "/topics/" + id
}

// SubscriptionName is the full name, projects/<project>/subscriptions/<id>,
// of a subscription id; a full name is returned as it is.
func (p *PubSub) SubscriptionName(id string) string {
	if strings.HasPrefix(id, "projects/") {
		return id
	}
	return "projects/" + p.Project + "/subscriptions/" + id
}

// CreateTopics creates the topics, given as ids or full names, that do not
// exist yet.
func (p *PubSub) CreateTopics(ctx context.Context, topics ...string) error {
	for _, t := range topics {
		_, err := p.client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: p.TopicName(t)})
		if err != nil && status.Code(err) != codes.AlreadyExists {
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	return nil
}

// Trigger is a push subscription as the deployment creates it: an Eventarc
// trigger's subscription, or a push subscription of its own.
type Trigger struct {
	// Name is the subscription id.
	Name string
	// Topic is the topic id (or full name) the subscription is on; it must exist.
	Topic string
	// PushEndpoint is the URL the messages are pushed to; empty for a pull
	// subscription (CreateTriggerSubscription).
	PushEndpoint string
	// AckDeadline is also the push timeout. Zero: 10 s, Pub/Sub's default.
	AckDeadline time.Duration
	// MinBackoff and MaxBackoff make the RetryPolicy. Both zero: no
	// RetryPolicy, that is immediate redelivery (the emulator waits about 1 s).
	MinBackoff, MaxBackoff time.Duration
	// MaxDeliveryAttempts is the number of deliveries after which a message
	// goes to the dead-letter topic, 5 to 100. Zero: 5.
	MaxDeliveryAttempts int32
}

// DeadLetterTopic is the id of the dead-letter topic of a trigger's topic.
func DeadLetterTopic(topic string) string {
	return topic + "-dead-letter"
}

// DeadLetterSubscription is the id of the pull subscription that collects a
// trigger's dead-lettered messages.
func DeadLetterSubscription(trigger string) string {
	return trigger + "-dead-letter"
}

// CreatePushSubscription creates t's push subscription with its RetryPolicy
// and a DeadLetterPolicy to the topic DeadLetterTopic(t.Topic), creating that
// topic if needed, and a pull subscription DeadLetterSubscription(t.Name) on
// the dead-letter topic for DeadLettered. It fails if the subscription
// exists.
func (p *PubSub) CreatePushSubscription(ctx context.Context, t Trigger) error {
	if t.PushEndpoint == "" {
		return fmt.Errorf("trigger %q: a push endpoint is required", t.Name)
	}
	return p.CreateTriggerSubscription(ctx, t)
}

// CreateTriggerSubscription is CreatePushSubscription, or, for a trigger
// without a push endpoint, creates a pull subscription with no retry or
// dead-letter policy, for a receiver that applies them itself
// (eventarc.Adapter.Receive); the dead-letter topic and subscription are
// created all the same.
func (p *PubSub) CreateTriggerSubscription(ctx context.Context, t Trigger) error {
	if t.Name == "" || t.Topic == "" {
		return fmt.Errorf("trigger %q: name and topic are required", t.Name)
	}
	if strings.HasPrefix(t.Name, "projects/") {
		return fmt.Errorf("trigger %q: give the subscription id, not its full name", t.Name)
	}
	dlTopic := DeadLetterTopic(p.TopicName(t.Topic))
	if err := p.CreateTopics(ctx, dlTopic); err != nil {
		return err
	}
	// The pull subscription exists before the first message can be dead-lettered.
	_, err := p.client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name:               p.SubscriptionName(DeadLetterSubscription(t.Name)),
		Topic:              dlTopic,
		AckDeadlineSeconds: 60,
	})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("create dead-letter subscription of %s: %w", t.Name, err)
	}
	attempts := t.MaxDeliveryAttempts
	if attempts == 0 {
		attempts = 5
	}
	sub := &pubsubpb.Subscription{
		Name:  p.SubscriptionName(t.Name),
		Topic: p.TopicName(t.Topic),
	}
	if t.AckDeadline > 0 {
		sub.AckDeadlineSeconds = int32(t.AckDeadline / time.Second)
	}
	if t.PushEndpoint != "" {
		sub.PushConfig = &pubsubpb.PushConfig{PushEndpoint: t.PushEndpoint}
		sub.DeadLetterPolicy = &pubsubpb.DeadLetterPolicy{DeadLetterTopic: dlTopic, MaxDeliveryAttempts: attempts}
	}
	if t.PushEndpoint != "" && (t.MinBackoff > 0 || t.MaxBackoff > 0) {
		sub.RetryPolicy = &pubsubpb.RetryPolicy{
			MinimumBackoff: durationpb.New(t.MinBackoff),
			MaximumBackoff: durationpb.New(t.MaxBackoff),
		}
	}
	if _, err := p.client.SubscriptionAdminClient.CreateSubscription(ctx, sub); err != nil {
		return fmt.Errorf("create subscription %s: %w", t.Name, err)
	}
	return nil
}

// deadLetterSourceAttr is the attribute Pub/Sub sets on a dead-lettered
// message: the id of the subscription it was dead-lettered from.
const deadLetterSourceAttr = "CloudPubSubDeadLetterSourceSubscription"

// Subscriber is the subscriber API, for receivers that pull.
func (p *PubSub) Subscriber() *vkit.SubscriptionAdminClient { return p.client.SubscriptionAdminClient }

// Forward publishes a message to a topic (a full name), as Pub/Sub forwards
// a dead-lettered message.
func (p *PubSub) Forward(ctx context.Context, topic string, m *pubsubpb.PubsubMessage) error {
	_, err := p.client.TopicAdminClient.Publish(ctx, &pubsubpb.PublishRequest{Topic: topic, Messages: []*pubsubpb.PubsubMessage{m}})
	return err
}

// DeadLetteredMessages returns the messages DeadLettered has counted for
// the trigger so far.
func (p *PubSub) DeadLetteredMessages(trigger string) []*pubsubpb.PubsubMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*pubsubpb.PubsubMessage(nil), p.deadMessages[trigger]...)
}

// DeadLettered returns how many messages have been dead-lettered from the
// trigger's subscription since it was created. It pulls and acknowledges
// what has arrived on the trigger's dead-letter subscription and keeps a
// running total. Messages dead-lettered from another subscription of the
// same topic are acknowledged and not counted here.
func (p *PubSub) DeadLettered(ctx context.Context, trigger string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	subName := p.SubscriptionName(DeadLetterSubscription(trigger))
	for {
		resp, err := p.client.SubscriptionAdminClient.Pull(ctx, &pubsubpb.PullRequest{
			Subscription: subName,
			MaxMessages:  1000,
			// Deprecated for the service, but the emulator then answers at once,
			// which a count needs.
			ReturnImmediately: true, //nolint:staticcheck // see above
		})
		if err != nil {
			return p.deadLettered[trigger], fmt.Errorf("pull %s: %w", subName, err)
		}
		if len(resp.ReceivedMessages) == 0 {
			return p.deadLettered[trigger], nil
		}
		ids := make([]string, 0, len(resp.ReceivedMessages))
		for _, m := range resp.ReceivedMessages {
			ids = append(ids, m.AckId)
			if src := m.GetMessage().GetAttributes()[deadLetterSourceAttr]; src == "" || src == trigger || src == p.SubscriptionName(trigger) {
				p.deadLettered[trigger]++
				p.deadMessages[trigger] = append(p.deadMessages[trigger], m.GetMessage())
			}
		}
		if err := p.client.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{
			Subscription: subName, AckIds: ids,
		}); err != nil {
			return p.deadLettered[trigger], fmt.Errorf("acknowledge on %s: %w", subName, err)
		}
	}
}

// javaBinary finds java: $JAVA_HOME/bin/java, else java on PATH.
func javaBinary() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		j := filepath.Join(home, "bin", "java")
		if _, err := os.Stat(j); err == nil {
			return j, nil
		}
	}
	j, err := exec.LookPath("java")
	if err != nil {
		return "", errors.New("pubsub emulator: java not found (install a JRE 11 or newer, or set JAVA_HOME)")
	}
	return j, nil
}

// pubsubJar finds the emulator's jar: $RAYDROP_PUBSUB_EMULATOR_JAR, else the
// one in the Cloud SDK (gcloud components install pubsub-emulator), looked
// for in the usual install places first and then where gcloud says the SDK
// is.
func pubsubJar() (string, error) {
	if j := os.Getenv(PubSubJarEnv); j != "" {
		if _, err := os.Stat(j); err != nil {
			return "", fmt.Errorf("%s: %w", PubSubJarEnv, err)
		}
		return j, nil
	}
	roots := []string{"/usr/lib/google-cloud-sdk", "/usr/share/google-cloud-sdk", "/opt/google-cloud-sdk"}
	for _, r := range roots {
		if j := newestJar(r); j != "" {
			return j, nil
		}
	}
	if out, err := exec.Command("gcloud", "info", "--format=value(installation.sdk_root)").Output(); err == nil {
		if r := strings.TrimSpace(string(out)); r != "" {
			if j := newestJar(r); j != "" {
				return j, nil
			}
			roots = append(roots, r)
		}
	}
	return "", fmt.Errorf("pubsub emulator jar not found under %s; install it with "+
		"`gcloud components install pubsub-emulator` (or the google-cloud-cli-pubsub-emulator package), or set %s",
		strings.Join(roots, ", "), PubSubJarEnv)
}

func newestJar(sdkRoot string) string {
	jars, _ := filepath.Glob(filepath.Join(sdkRoot, "platform", "pubsub-emulator", "lib", "cloud-pubsub-emulator-*-all.jar"))
	if len(jars) == 0 {
		return ""
	}
	sort.Strings(jars)
	return jars[len(jars)-1]
}
