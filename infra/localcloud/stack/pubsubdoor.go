package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// pubsubDoor is one function's way to the Pub/Sub emulator: a gRPC proxy
// that forwards a Publish to a topic the function's identity has
// roles/pubsub.publisher on (the wiring table's Publishes) unchanged, and
// refuses everything else as Pub/Sub does: PERMISSION_DENIED, "User not
// authorized to perform this action."
// (https://cloud.google.com/pubsub/docs/reference/error-codes). The role
// holds pubsub.topics.publish alone: no function may look up, create or
// delete a topic or a subscription, or pull.
type pubsubDoor struct {
	target  string
	allowed []string // full topic names
	up      *grpc.ClientConn
	srv     *grpc.Server
	addr    string

	mu      sync.Mutex
	refused []PublishRefusal
}

// PublishRefusal is a call the Pub/Sub door refused: a publish to a topic
// outside the grant, or any other method.
type PublishRefusal struct {
	Function, Method, Topic string
	// Data: a refused publish's first message data (64 bytes at most), or
	// another method's request as sent (200 bytes at most).
	Data string
	At   time.Time
}

// rawCodec passes messages through as bytes.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "raydrop-raw" }

const publishMethod = "/google.pubsub.v1.Publisher/Publish"

func (s *Stack) openPubSubDoor(target string) (*pubsubDoor, error) {
	f := functionOf(target)
	d := &pubsubDoor{target: target}
	for _, k := range f.Publishes {
		d.allowed = append(d.allowed, s.PubSub.TopicName(Topics.Name(k)))
	}
	var err error
	if d.up, err = grpc.NewClient(s.PubSub.Host, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = d.up.Close()
		return nil, err
	}
	d.addr = l.Addr().String()
	d.srv = grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(d.forward))
	go func() { _ = d.srv.Serve(l) }()
	return d, nil
}

func (d *pubsubDoor) close() {
	d.srv.Stop()
	_ = d.up.Close()
}

// forward relays one call, message by message, both ways. A Publish (a
// unary call: one request) is checked before anything is forwarded.
func (d *pubsubDoor) forward(_ any, in grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(in)
	var first []byte
	if err := in.RecvMsg(&first); err != nil {
		return err
	}
	if method != publishMethod {
		d.refuse(PublishRefusal{Function: d.target, Method: method, Data: string(first[:min(len(first), 200)]), At: time.Now()})
		return errNotAuthorized
	}
	if err := d.check(first); err != nil {
		return err
	}
	md, _ := metadata.FromIncomingContext(in.Context())
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(in.Context(), md.Copy()))
	defer cancel()
	out, err := d.up.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	if err := out.SendMsg(&first); err != nil {
		return err
	}
	go func() {
		for {
			var msg []byte
			if err := in.RecvMsg(&msg); err != nil {
				_ = out.CloseSend()
				return
			}
			if err := out.SendMsg(&msg); err != nil {
				return
			}
		}
	}()
	if h, err := out.Header(); err == nil {
		_ = in.SendHeader(h)
	}
	for {
		var msg []byte
		if err := out.RecvMsg(&msg); err != nil {
			in.SetTrailer(out.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := in.SendMsg(&msg); err != nil {
			return err
		}
	}
}

// check refuses a publish to a topic the function may not publish to.
func (d *pubsubDoor) check(msg []byte) error {
	var req pubsubpb.PublishRequest
	if err := proto.Unmarshal(msg, &req); err != nil {
		return status.Error(codes.InvalidArgument, "malformed PublishRequest")
	}
	if slices.Contains(d.allowed, req.GetTopic()) {
		return nil
	}
	r := PublishRefusal{Function: d.target, Method: publishMethod, Topic: req.GetTopic(), At: time.Now()}
	if ms := req.GetMessages(); len(ms) > 0 {
		r.Data = string(ms[0].GetData()[:min(len(ms[0].GetData()), 64)])
	}
	d.refuse(r)
	return errNotAuthorized
}

// errNotAuthorized is Pub/Sub's answer to a call the caller has no
// permission for.
var errNotAuthorized = status.Error(codes.PermissionDenied, "User not authorized to perform this action.")

func (d *pubsubDoor) refuse(r PublishRefusal) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refused = append(d.refused, r)
}

// PublishRefusals are the publishes every function's Pub/Sub door refused.
func (s *Stack) PublishRefusals() []PublishRefusal {
	var out []PublishRefusal
	for _, d := range s.pubsubDoors {
		d.mu.Lock()
		out = append(out, d.refused...)
		d.mu.Unlock()
	}
	return out
}

// PubSubDoor is the address of a function's Pub/Sub door.
func (s *Stack) PubSubDoor(target string) (string, error) {
	d, ok := s.pubsubDoors[target]
	if !ok {
		return "", fmt.Errorf("no function %q", target)
	}
	return d.addr, nil
}
