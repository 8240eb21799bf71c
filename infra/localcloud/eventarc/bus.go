package eventarc

import (
	"context"
	"net"
	"strings"
	"sync"

	"cloud.google.com/go/eventarc/publishing/apiv1/publishingpb"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Bus is the local cloud's Eventarc Advanced message bus: a gRPC server
// speaking Eventarc's publishing API (google.cloud.eventarc.publishing.v1,
// Publisher.Publish) that records every event it accepts. Eventarc has no
// emulator; this stands for the bus itself, not for its enrollments and
// pipelines, which route the events onwards in the cloud.
//
// It holds publishers to what the API checks
// (https://cloud.google.com/eventarc/docs/reference/publishing/rpc/google.cloud.eventarc.publishing.v1#publishrequest):
// the request names this bus (projects/P/locations/L/messageBuses/B; any
// other is NOT_FOUND), carries one CloudEvent in the JSON event format, and
// that event is valid CloudEvents 1.0 with the required id, source, type and
// specversion (else INVALID_ARGUMENT). SetDown makes it answer UNAVAILABLE,
// as an outage would.
type Bus struct {
	publishingpb.UnimplementedPublisherServer
	name string
	srv  *grpc.Server
	addr string

	mu       sync.Mutex
	down     bool
	received []cloudevents.Event
	refused  int
}

// StartBus serves the bus name on a loopback port until Stop.
func StartBus(name string) (*Bus, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &Bus{name: name, srv: grpc.NewServer(), addr: l.Addr().String()}
	publishingpb.RegisterPublisherServer(b.srv, b)
	go func() { _ = b.srv.Serve(l) }()
	return b, nil
}

// Addr is the bus's host:port, for the publishing client's endpoint.
func (b *Bus) Addr() string { return b.addr }

// Name is the bus's resource name.
func (b *Bus) Name() string { return b.name }

// Stop stops serving.
func (b *Bus) Stop() { b.srv.Stop() }

// SetDown makes the bus refuse every publish (UNAVAILABLE) until set up.
func (b *Bus) SetDown(down bool) {
	b.mu.Lock()
	b.down = down
	b.mu.Unlock()
}

// Received returns the events the bus accepted, in order.
func (b *Bus) Received() []cloudevents.Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]cloudevents.Event(nil), b.received...)
}

// Refused is how many publishes the bus refused while down.
func (b *Bus) Refused() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refused
}

// Publish accepts one CloudEvent for the bus.
func (b *Bus) Publish(_ context.Context, req *publishingpb.PublishRequest) (*publishingpb.PublishResponse, error) {
	if req.GetMessageBus() != b.name {
		return nil, status.Errorf(codes.NotFound, "message bus %q not found", req.GetMessageBus())
	}
	var e cloudevents.Event
	switch f := req.GetFormat().(type) {
	case *publishingpb.PublishRequest_JsonMessage:
		if err := e.UnmarshalJSON([]byte(f.JsonMessage)); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "json_message is not a CloudEvent in the JSON format: %v", err)
		}
	case nil:
		return nil, status.Error(codes.InvalidArgument, "the request carries no event (proto_message, json_message or avro_message)")
	default:
		return nil, status.Errorf(codes.Unimplemented, "the local bus takes json_message only, not %T", f)
	}
	if err := e.Validate(); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "invalid CloudEvent: %v", strings.TrimSpace(err.Error()))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		b.refused++
		return nil, status.Error(codes.Unavailable, "the message bus is unavailable")
	}
	b.received = append(b.received, e)
	return &publishingpb.PublishResponse{}, nil
}
