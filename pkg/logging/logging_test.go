package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
)

func TestCloudLoggingFields(t *testing.T) {
	var b bytes.Buffer
	New(&b, slog.LevelInfo).Warn("run_accepted", "run_id", "r1", "source", "gs://b/jobs/x.json#1")
	var line map[string]any
	if err := json.Unmarshal(b.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, b.String())
	}
	if line["message"] != "run_accepted" || line["severity"] != "WARNING" {
		t.Errorf("message/severity: %s", b.String())
	}
	loc, ok := line["logging.googleapis.com/sourceLocation"].(map[string]any)
	if !ok || loc["file"] == "" || loc["line"] == "" {
		t.Errorf("source location: %s", b.String())
	}
	if line["source"] != "gs://b/jobs/x.json#1" {
		t.Errorf("an attribute named source must keep its name and value: %s", b.String())
	}
	if n := bytes.Count(b.Bytes(), []byte(`"logging.googleapis.com/sourceLocation"`)); n != 1 {
		t.Errorf("sourceLocation appears %d times: %s", n, b.String())
	}
}
