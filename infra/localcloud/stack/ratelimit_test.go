package stack

import "testing"

func TestObjectOf(t *testing.T) {
	for _, c := range []struct{ method, path, want string }{
		{"POST", "/upload/storage/v1/b/st/o?alt=json&ifGenerationMatch=0&name=runs%2Fr1%2Fstatus.json&uploadType=multipart", "st/runs/r1/status.json"},
		{"POST", "/upload/storage/v1/b/st/o?upload_id=abc&uploadType=resumable", ""},
		{"PATCH", "/storage/v1/b/st/o/runs%2Fr1%2Fstatus.json?alt=json", "st/runs/r1/status.json"},
		{"DELETE", "/storage/v1/b/st/o/clusters%2Fdefault%2Fc%2Fwaiting%2Fr1.json", "st/clusters/default/c/waiting/r1.json"},
		{"POST", "/storage/v1/b/st/o/a%2Fb/compose", "st/a/b"},
		{"POST", "/storage/v1/b/src/o/x/rewriteTo/b/dst/o/y%2Fz", "dst/y/z"},
		{"PUT", "/st/runs/r1/status.json", "st/runs/r1/status.json"},
		{"POST", "/storage/v1/b", ""},
		{"PATCH", "/storage/v1/b/st", ""},
	} {
		if got := objectOf(c.method, c.path); got != c.want {
			t.Errorf("objectOf(%s %s) = %q, want %q", c.method, c.path, got, c.want)
		}
	}
}
