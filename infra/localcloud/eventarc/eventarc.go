// Package eventarc delivers Pub/Sub messages to functions as CloudEvents,
// the way Eventarc delivers them to Cloud Run functions in the cloud, for
// the local cloud, where no Eventarc exists.
//
// The local cloud's routes receive from pull subscriptions (Receive, in
// pull.go), so that as many events reach a function at once as the
// deployment lets its instances serve; the Pub/Sub emulator pushes at most
// two messages at once per subscription, which would make the local cloud
// measure the emulator. Each message is handled as a push is, below.
//
// Each Route stands for one Eventarc trigger. A push subscription on the
// Pub/Sub emulator pushes to the route's endpoint (PushEndpoint); the
// adapter turns the push into the CloudEvent Eventarc would send, posts it
// to the function in binary content mode (context attributes in ce-*
// headers, percent-encoded as the CloudEvents HTTP binding requires, the
// data as the body) and answers the push with the function's
// status code, so the subscription's retry and dead-letter policies act on
// the function's failures as they do in the cloud:
//
//   - StorageFinalized: the push carries a Cloud Storage notification
//     (payload JSON_API_V1). Only OBJECT_FINALIZE events of the route's
//     bucket are delivered, as the trigger's event filters select; others
//     are acknowledged (204) and dropped. The event is
//     google.cloud.storage.object.v1.finalized with source
//     //storage.googleapis.com/projects/_/buckets/<bucket>, subject
//     objects/<name>, the extension bucket, id the notification's message
//     id, time its eventTime, and the object resource JSON as data.
//   - PubSubPublished: every message is delivered as
//     google.cloud.pubsub.topic.v1.messagePublished with source
//     //pubsub.googleapis.com/<topic>, id the message id, time the publish
//     time, and data {"message": {...}, "subscription": "..."}.
//
// A function that cannot be reached gets 503 to the push, a push that is
// not a valid Pub/Sub push for the route 400; both are logged.
package eventarc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
)

// Kind is the event a route delivers.
type Kind int

const (
	// StorageFinalized: google.cloud.storage.object.v1.finalized from Cloud
	// Storage notifications.
	StorageFinalized Kind = iota + 1
	// PubSubPublished: google.cloud.pubsub.topic.v1.messagePublished.
	PubSubPublished
)

// The CloudEvent types the routes deliver.
const (
	StorageFinalizedType = "google.cloud.storage.object.v1.finalized"
	PubSubPublishedType  = "google.cloud.pubsub.topic.v1.messagePublished"
)

func (k Kind) String() string {
	switch k {
	case StorageFinalized:
		return StorageFinalizedType
	case PubSubPublished:
		return PubSubPublishedType
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Route is one Eventarc trigger.
type Route struct {
	// Name names the route in its push endpoint, /routes/<name>.
	Name string
	Kind Kind
	// Target is the URL of the function the events go to.
	Target string
	// Bucket, for StorageFinalized, is the trigger's bucket filter: events
	// of other buckets are dropped. Empty: every bucket.
	Bucket string
	// Topic, for PubSubPublished, is the full topic name,
	// projects/<project>/topics/<topic>, the events' source.
	Topic string
}

// RouteStats counts what a route did.
type RouteStats struct {
	// Pushes is the number of push requests the route received.
	Pushes int
	// Deliveries is the number of events posted to the function, every
	// redelivery included.
	Deliveries int
	// Ignored is the number of pushes dropped by the route's filters.
	Ignored int
	// BadPushes is the number of pushes answered 400.
	BadPushes int
	// Unreachable is the number of deliveries that got no answer from the
	// function: it could not be reached, or the push timed out first
	// (answered 503 to the push).
	Unreachable int
	// Codes counts the function's answers by HTTP status code.
	Codes map[int]int
	// Dropped is the number of pushes acknowledged without delivery (see
	// Adapter.DropNext).
	Dropped int
}

// Adapter is the Eventarc of the local cloud: an http.Handler serving
// POST /routes/<name> for each route.
type Adapter struct {
	routes map[string]Route
	order  []string
	log    *slog.Logger
	client *http.Client
	mux    *http.ServeMux

	mu       sync.Mutex
	drops    []*drop // deliveries still to lose
	observer func(Delivery)
	stats    map[string]*RouteStats
	baseURL  string
	server   *http.Server
}

// maxPushBytes bounds a push body: a 10 MB message, base64-encoded, and its
// attributes.
const maxPushBytes = 16 << 20

// New returns an adapter for routes. log may be nil (no logging); client
// posts the events and may be nil (http.DefaultClient's settings, no
// timeout: the push's own deadline, the subscription's ack deadline, bounds
// each delivery).
func New(routes []Route, log *slog.Logger, client *http.Client) *Adapter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if client == nil {
		client = &http.Client{}
	}
	a := &Adapter{
		routes: map[string]Route{},
		log:    log,
		client: client,
		stats:  map[string]*RouteStats{},
	}
	for _, r := range routes {
		if _, dup := a.routes[r.Name]; !dup {
			a.order = append(a.order, r.Name)
		}
		a.routes[r.Name] = r
		a.stats[r.Name] = &RouteStats{Codes: map[int]int{}}
	}
	a.mux = http.NewServeMux()
	a.mux.HandleFunc("POST /routes/{name}", a.push)
	return a
}

// validate checks the routes New was given.
func validate(routes []Route) error {
	seen := map[string]bool{}
	var errs []error
	for _, r := range routes {
		if r.Name == "" || strings.Contains(r.Name, "/") {
			errs = append(errs, fmt.Errorf("route %q: a name without / is required", r.Name))
		}
		if seen[r.Name] {
			errs = append(errs, fmt.Errorf("route %q: defined twice", r.Name))
		}
		seen[r.Name] = true
		if u, err := url.Parse(r.Target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("route %q: target %q is not an http(s) URL", r.Name, r.Target))
		}
		switch r.Kind {
		case StorageFinalized:
		case PubSubPublished:
			if !strings.HasPrefix(r.Topic, "projects/") || !strings.Contains(r.Topic, "/topics/") {
				errs = append(errs, fmt.Errorf("route %q: topic %q is not projects/<project>/topics/<topic>", r.Name, r.Topic))
			}
		default:
			errs = append(errs, fmt.Errorf("route %q: unknown kind %v", r.Name, r.Kind))
		}
	}
	return errors.Join(errs...)
}

// Start checks the routes and serves the adapter on a free port of
// 127.0.0.1 until ctx ends or Close is called. It returns the base URL,
// http://127.0.0.1:port.
func (a *Adapter) Start(ctx context.Context) (string, error) {
	routes := make([]Route, 0, len(a.order))
	for _, n := range a.order {
		routes = append(routes, a.routes[n])
	}
	if err := validate(routes); err != nil {
		return "", err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.server != nil {
		return "", errors.New("eventarc adapter already started")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second}
	a.server = srv
	a.baseURL = "http://" + l.Addr().String()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("eventarc adapter stopped serving", "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return a.baseURL, nil
}

// Close stops serving; deliveries in flight are cut off.
func (a *Adapter) Close() error {
	a.mu.Lock()
	srv := a.server
	a.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Close()
}

// PushEndpoint is the URL the route's push subscription pushes to (a path
// only before Start).
func (a *Adapter) PushEndpoint(route string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.baseURL + "/routes/" + url.PathEscape(route)
}

// Stats returns a copy of every route's counts.
func (a *Adapter) Stats() map[string]RouteStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]RouteStats, len(a.stats))
	for name, s := range a.stats {
		c := *s
		c.Codes = make(map[int]int, len(s.Codes))
		for code, n := range s.Codes {
			c.Codes[code] = n
		}
		out[name] = c
	}
	return out
}

func (a *Adapter) count(route string, f func(*RouteStats)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s := a.stats[route]; s != nil {
		f(s)
	}
}

// ServeHTTP serves POST /routes/<name>.
func (a *Adapter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mux.ServeHTTP(w, r)
}

// pushRequest is the body of a Pub/Sub push request (the wrapped format).
type pushRequest struct {
	Message      pushedMessage `json:"message"`
	Subscription string        `json:"subscription"`
}

type pushedMessage struct {
	Data        []byte            `json:"data,omitempty"`
	Attributes  map[string]string `json:"attributes,omitempty"`
	MessageID   string            `json:"messageId"`
	PublishTime string            `json:"publishTime"`
	OrderingKey string            `json:"orderingKey,omitempty"`
}

// messagePublishedData is the data of a messagePublished event
// (google.events.cloud.pubsub.v1.MessagePublishedData).
type messagePublishedData struct {
	Message      pushedMessage `json:"message"`
	Subscription string        `json:"subscription"`
}

// errIgnored marks a push the route's filters drop.
type errIgnored struct{ why string }

func (e errIgnored) Error() string { return e.why }

func (a *Adapter) push(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if _, ok := a.routes[name]; !ok {
		a.log.Warn("eventarc: push for an unknown route", "route", name)
		http.Error(w, "unknown route "+name, http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPushBytes))
	var p pushRequest
	if err == nil {
		err = json.Unmarshal(body, &p)
	}
	if err != nil {
		a.count(name, func(s *RouteStats) { s.Pushes++; s.BadPushes++ })
		a.observe(Delivery{Route: name, Outcome: Bad, Err: err, Start: time.Now()})
		a.log.Error("eventarc: bad push", "route", name, "err", err, "body", truncate(body, 512))
		http.Error(w, "bad push: "+err.Error(), http.StatusBadRequest)
		return
	}
	code, msg := a.handle(r.Context(), name, p)
	if msg != "" {
		http.Error(w, msg, code)
		return
	}
	w.WriteHeader(code)
}

// handle delivers one message of route (a push's, or one pulled) and
// returns the status a push would be answered with, and an error message
// for the answer's body: 2xx acknowledges the message, anything else has
// Pub/Sub redeliver it.
func (a *Adapter) handle(ctx context.Context, name string, p pushRequest) (int, string) {
	route := a.routes[name]
	a.count(name, func(s *RouteStats) { s.Pushes++ })
	log := a.log.With("route", name, "target", route.Target)
	start := time.Now()
	ev, err := a.toEvent(route, p)
	var ignored errIgnored
	switch {
	case errors.As(err, &ignored):
		a.count(name, func(s *RouteStats) { s.Ignored++ })
		a.observe(Delivery{Route: name, Outcome: Ignored, Event: ev, Start: start})
		log.Debug("eventarc: push dropped by the trigger's filters", "why", ignored.why, "messageId", p.Message.MessageID)
		return http.StatusNoContent, ""
	case err != nil:
		a.count(name, func(s *RouteStats) { s.BadPushes++ })
		a.observe(Delivery{Route: name, Outcome: Bad, Err: err, Start: start})
		log.Error("eventarc: bad push", "err", err, "messageId", p.Message.MessageID)
		return http.StatusBadRequest, "bad push: " + err.Error()
	}
	if a.takeDrop(name, ev) {
		// A lost message: acknowledged, never delivered.
		a.count(name, func(s *RouteStats) { s.Dropped++ })
		a.observe(Delivery{Route: name, Outcome: Dropped, Event: ev, Start: start})
		log.Warn("eventarc: push dropped on purpose", "id", ev.ID(), "subject", ev.Subject())
		return http.StatusNoContent, ""
	}

	code, answer, err := a.deliver(ctx, route.Target, &ev)
	a.observe(Delivery{Route: name, Outcome: Delivered, Event: ev, Code: code, Err: err, Start: start, Took: time.Since(start)})
	a.count(name, func(s *RouteStats) {
		s.Deliveries++
		if err != nil {
			s.Unreachable++
		} else {
			s.Codes[code]++
		}
	})
	attrs := []any{"id", ev.ID(), "type", ev.Type(), "subject", ev.Subject()}
	switch {
	case err != nil:
		log.Warn("eventarc: no answer from the function, Pub/Sub will redeliver", append(attrs, "err", err)...)
		return http.StatusServiceUnavailable, "function unreachable: " + err.Error()
	case code >= 200 && code < 300:
		log.Debug("eventarc: delivered", append(attrs, "status", code)...)
	default:
		log.Warn("eventarc: function failed, Pub/Sub will redeliver", append(attrs, "status", code, "answer", answer)...)
	}
	return code, ""
}

// toEvent makes the CloudEvent Eventarc sends for a push on route.
func (a *Adapter) toEvent(route Route, p pushRequest) (event.Event, error) {
	m := p.Message
	if m.MessageID == "" {
		return event.Event{}, errors.New("no message.messageId")
	}
	ev := event.New(event.CloudEventsVersionV1)
	ev.SetID(m.MessageID)
	switch route.Kind {
	case StorageFinalized:
		at := m.Attributes
		if t := at["eventType"]; t != "OBJECT_FINALIZE" {
			return ev, errIgnored{"event type " + t}
		}
		if b := at["bucketId"]; route.Bucket != "" && b != route.Bucket {
			return ev, errIgnored{"bucket " + b}
		}
		bucket, object := at["bucketId"], at["objectId"]
		if bucket == "" || object == "" {
			return ev, errors.New("storage notification without bucketId or objectId")
		}
		if f := at["payloadFormat"]; f != "JSON_API_V1" {
			return ev, fmt.Errorf("storage notification payload %q, not JSON_API_V1", f)
		}
		if !json.Valid(m.Data) {
			return ev, errors.New("storage notification data is not the object's JSON")
		}
		ev.SetType(StorageFinalizedType)
		ev.SetSource("//storage.googleapis.com/projects/_/buckets/" + bucket)
		ev.SetSubject("objects/" + object)
		ev.SetExtension("bucket", bucket)
		ev.SetTime(firstTime(at["eventTime"], m.PublishTime))
		if err := ev.SetData(event.ApplicationJSON, m.Data); err != nil {
			return ev, err
		}
	case PubSubPublished:
		ev.SetType(PubSubPublishedType)
		ev.SetSource("//pubsub.googleapis.com/" + route.Topic)
		ev.SetTime(firstTime(m.PublishTime))
		data, err := json.Marshal(messagePublishedData{Message: m, Subscription: p.Subscription})
		if err != nil {
			return ev, err
		}
		if err := ev.SetData(event.ApplicationJSON, data); err != nil {
			return ev, err
		}
	default:
		return ev, fmt.Errorf("unknown route kind %v", route.Kind)
	}
	return ev, ev.Validate()
}

// firstTime is the first of the RFC 3339 times that parses, else now.
func firstTime(ts ...string) time.Time {
	for _, s := range ts {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return t
		}
	}
	return time.Now().UTC()
}

// deliver posts ev to target in binary content mode and returns the status
// code and the start of the answer's body; err means no answer.
func (a *Adapter) deliver(ctx context.Context, target string, ev *event.Event) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, nil)
	if err != nil {
		return 0, "", err
	}
	if err := cehttp.WriteRequest(binding.WithForceBinary(ctx), binding.ToMessage(ev), req); err != nil {
		return 0, "", err
	}
	percentEncodeCE(req.Header)
	resp, err := a.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, strings.TrimSpace(string(answer)), nil
}

// percentEncodeCE percent-encodes the ce-* header values as the CloudEvents
// HTTP binding requires (section 3.1.3.2): space, '"', '%' and everything
// outside printable ASCII, as UTF-8 bytes. An object name with control
// characters or non-ASCII letters thus reaches the function as a subject
// header it can be sent in, where a raw value would not be a valid header.
func percentEncodeCE(h http.Header) {
	for k, vs := range h {
		if !strings.HasPrefix(strings.ToLower(k), "ce-") {
			continue
		}
		for i, v := range vs {
			var b strings.Builder
			for _, c := range []byte(v) {
				if c <= ' ' || c > '~' || c == '"' || c == '%' {
					fmt.Fprintf(&b, "%%%02X", c)
				} else {
					b.WriteByte(c)
				}
			}
			vs[i] = b.String()
		}
	}
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// DropNext makes the route lose its next n pushes: each is acknowledged and
// never delivered, as a message lost between services would be. It is the
// fault the tests inject to prove that the pipeline's sweep recovers.
func (a *Adapter) DropNext(route string, n int) { a.DropMatching(route, n, nil) }

// DropMatching makes the route lose the next n pushes whose event match
// accepts (nil: any).
func (a *Adapter) DropMatching(route string, n int, match func(event.Event) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.drops = append(a.drops, &drop{route: route, left: n, match: match})
}

type drop struct {
	route string
	left  int
	match func(event.Event) bool
}

func (a *Adapter) takeDrop(route string, ev event.Event) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, d := range a.drops {
		if d.route != route || d.match != nil && !d.match(ev) {
			continue
		}
		if d.left--; d.left <= 0 {
			a.drops = append(a.drops[:i], a.drops[i+1:]...)
		}
		return true
	}
	return false
}

// What the adapter did with a push.
const (
	Delivered = "delivered" // posted to the function (Code or Err says how it went)
	Dropped   = "dropped"   // lost on purpose (DropNext)
	Ignored   = "ignored"   // filtered out by the trigger
	Bad       = "bad"       // not a valid push for the route
)

// Delivery is what the adapter did with one push.
type Delivery struct {
	Route   string
	Outcome string
	// Event is the CloudEvent made from the push (empty for a bad push).
	Event event.Event
	// Code is the function's answer; 0 with Err when it gave none.
	Code  int
	Err   error
	Start time.Time
	Took  time.Duration
}

// Observe makes the adapter call f after each push it handled, on the
// push's goroutine; nil stops it.
func (a *Adapter) Observe(f func(Delivery)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.observer = f
}

func (a *Adapter) observe(d Delivery) {
	a.mu.Lock()
	f := a.observer
	a.mu.Unlock()
	if f != nil {
		f(d)
	}
}
