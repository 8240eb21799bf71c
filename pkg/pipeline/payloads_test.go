package pipeline

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/runs"
)

func stepEvent(t *testing.T, data string) event.Event {
	t.Helper()
	e := event.New()
	e.SetID("1")
	e.SetType(PubSubPublished)
	e.SetSource("//pubsub.googleapis.com/projects/p/topics/raydrop-finished")
	b, err := json.Marshal(map[string]any{"message": map[string]any{"data": []byte(data), "messageId": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetData("application/json", b); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestDecodeStep(t *testing.T) {
	for _, tc := range []struct {
		data string
		want Step
		ok   bool
	}{
		{`{"runId": "r-1", "attempt": 2}`, Step{RunID: "r-1", Attempt: 2}, true},
		// A run cancelled while it waited never had an attempt.
		{`{"runId": "r-1", "attempt": 0}`, Step{RunID: "r-1", Attempt: 0}, true},
		// The events the sender published for the receiver to record.
		{`{"runId": "r-1", "attempt": 1, "published": ["RUNNING"]}`, Step{RunID: "r-1", Attempt: 1, Published: []runs.Phase{runs.Running}}, true},
		{`{"runId": "r-1", "attempt": 1, "published": ["FINISHING"]}`, Step{}, false},
		{`{"runId": "r-1", "attempt": 1, "published": ["BOGUS"]}`, Step{}, false},
		{`{"runId": "r-1", "attempt": -1}`, Step{}, false},
		{`{"runId": "", "attempt": 1}`, Step{}, false},
		{`{"runId": "../../runs/x", "attempt": 1}`, Step{}, false},
		{`{"attempt": 1}`, Step{}, false},
		{`not json`, Step{}, false},
	} {
		got, err := DecodeStep(stepEvent(t, tc.data))
		if tc.ok {
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("DecodeStep(%s) = %+v, %v; want %+v", tc.data, got, err, tc.want)
			}
			continue
		}
		if err == nil || !IsPermanent(err) {
			t.Errorf("DecodeStep(%s) = %+v, %v; want a permanent error", tc.data, got, err)
		}
	}
}
