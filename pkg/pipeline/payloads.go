package pipeline

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/spec"
)

// CloudEvent types the functions receive.
const (
	StorageFinalized = "google.cloud.storage.object.v1.finalized"
	PubSubPublished  = "google.cloud.pubsub.topic.v1.messagePublished"
)

// Int64 accepts a 64-bit number written as a JSON number or string, as
// Cloud Storage event payloads do.
type Int64 int64

// UnmarshalJSON reads a number or a numeric string.
func (n *Int64) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "" || s == "null" {
		*n = 0
		return nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("not an integer: %s", b)
	}
	*n = Int64(v)
	return nil
}

// StorageObject is the data of a storage object event: the object resource.
type StorageObject struct {
	Bucket     string            `json:"bucket"`
	Name       string            `json:"name"`
	Generation Int64             `json:"generation"`
	Size       Int64             `json:"size"`
	Metadata   map[string]string `json:"metadata"`
}

// Message is the data of a Pub/Sub message published event.
type Message struct {
	Message struct {
		Data       []byte            `json:"data"`
		Attributes map[string]string `json:"attributes"`
		MessageID  string            `json:"messageId"`
	} `json:"message"`
	Subscription string `json:"subscription"`
}

// DecodeObject decodes a storage event's data.
func DecodeObject(e event.Event) (StorageObject, error) {
	var o StorageObject
	if err := json.Unmarshal(e.Data(), &o); err != nil {
		return o, Permanent(fmt.Errorf("decode storage event %s: %w", e.ID(), err))
	}
	if o.Bucket == "" || o.Name == "" {
		return o, Permanent(fmt.Errorf("storage event %s names no bucket or object", e.ID()))
	}
	return o, nil
}

// DecodeMessage decodes a Pub/Sub event's data.
func DecodeMessage(e event.Event) (Message, error) {
	var m Message
	if err := json.Unmarshal(e.Data(), &m); err != nil {
		return m, Permanent(fmt.Errorf("decode pubsub event %s: %w", e.ID(), err))
	}
	if m.Message.MessageID == "" {
		m.Message.MessageID = e.ID()
	}
	return m, nil
}

// DecodeStep decodes a step message published by another function.
func DecodeStep(e event.Event) (Step, error) {
	m, err := DecodeMessage(e)
	if err != nil {
		return Step{}, err
	}
	var s Step
	if err := json.Unmarshal(m.Message.Data, &s); err != nil || (s.RunID == "") == (s.SweepID == "") || s.Attempt < 0 {
		return s, Permanent(fmt.Errorf("message %s is not a step message (want {\"runId\", \"attempt\" >= 0} or {\"sweepId\"}): %q", m.Message.MessageID, truncate(m.Message.Data, 200)))
	}
	if s.SweepID != "" {
		if msg := spec.CheckRunID(s.SweepID); msg != "" {
			return s, Permanent(fmt.Errorf("message %s names no valid sweep: sweepId %s", m.Message.MessageID, msg))
		}
		return s, nil
	}
	if msg := spec.CheckRunID(s.RunID); msg != "" {
		return s, Permanent(fmt.Errorf("message %s names no valid run: runId %s", m.Message.MessageID, msg))
	}
	for _, p := range s.Published {
		if p.Event() == "" {
			return s, Permanent(fmt.Errorf("message %s: published names %q, a phase without a public event", m.Message.MessageID, p))
		}
	}
	return s, nil
}

// TopicOf is the topic ID a Pub/Sub event came from (its source ends in
// /topics/<id>).
func TopicOf(e event.Event) string {
	src := e.Source()
	if i := strings.LastIndex(src, "/topics/"); i >= 0 {
		return src[i+len("/topics/"):]
	}
	return ""
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
