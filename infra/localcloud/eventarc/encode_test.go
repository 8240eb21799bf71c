package eventarc

import (
	"net/http"
	"testing"
)

func TestPercentEncodedHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("Ce-Subject", "objects/jobs/ctl\x01\x7f\tnamé \"50%\".json")
	h.Set("Content-Type", "application/json; charset=utf-8")
	percentEncodeCE(h)
	if got, want := h.Get("Ce-Subject"), "objects/jobs/ctl%01%7F%09nam%C3%A9%20%2250%25%22.json"; got != want {
		t.Errorf("ce-subject %q, want %q", got, want)
	}
	if got := h.Get("Content-Type"); got != "application/json; charset=utf-8" {
		t.Errorf("a header that is no context attribute changed: %q", got)
	}
}
