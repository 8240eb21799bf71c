package schemas_test

import (
	"strings"
	"testing"

	"github.com/raydrop/raydrop/schemas"
)

func TestMarkSchemaRefusesWhatItShould(t *testing.T) {
	good := `{"schemaVersion":1,"runId":"r","status":"failed","error":"E","experimentPath":"gs://b/p/attempt-1",
		"trialPath":null,"checkpoints":[],"latestCheckpoint":null,"finalMetrics":{},"data":null,"samples":null,"noticeSeen":false}`
	if err := schemas.ValidateMark([]byte(good)); err != nil {
		t.Fatalf("a good mark refused: %v", err)
	}
	for name, bad := range map[string]string{
		"no noticeSeen":  strings.Replace(good, `,"noticeSeen":false`, ``, 1),
		"unknown status": strings.Replace(good, `"failed"`, `"crashed"`, 1),
		"extra field":    strings.Replace(good, `"runId":"r"`, `"runId":"r","runID":"r"`, 1),
		"metric string":  strings.Replace(good, `"finalMetrics":{}`, `"finalMetrics":{"loss":"low"}`, 1),
		"bad data":       strings.Replace(good, `"data":null`, `"data":{"rows":1}`, 1),
	} {
		if schemas.ValidateMark([]byte(bad)) == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
