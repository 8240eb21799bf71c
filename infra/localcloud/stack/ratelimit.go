package stack

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/faults"
)

// ObjectWriteInterval is Cloud Storage's limit on writes to one object
// name: about one per second; faster writes are refused with 429
// (https://cloud.google.com/storage/quotas#objects, "Maximum rate of writes
// to the same object name"; https://cloud.google.com/storage/docs/gcs429).
// The local cloud's Cloud Storage door refuses a function's write to an
// object whose last write arrived less than this before.
const ObjectWriteInterval = time.Second

// limitObjectWrites makes the Cloud Storage door enforce
// ObjectWriteInterval.
func (s *Stack) limitObjectWrites() {
	s.GCSProxy.LimitWrites(ObjectWriteInterval, objectOf, rateLimited)
}

// RateLimited returns the writes the Cloud Storage door refused for the
// object write rate since the proxy's requests were last reset.
func (s *Stack) RateLimited() []faults.Request {
	var out []faults.Request
	for _, r := range s.GCSProxy.Requests() {
		if r.Injected && r.Status == http.StatusTooManyRequests {
			out = append(out, r)
		}
	}
	return out
}

// rateLimited is Cloud Storage's answer to a write over the object's rate.
func rateLimited(object string) string {
	msg := fmt.Sprintf("The object %s exceeded the rate limit for object mutation operations (create, update, and delete). Please reduce your request rate. See https://cloud.google.com/storage/docs/gcs429.", object)
	return fmt.Sprintf(`{"error":{"code":429,"message":%q,"errors":[{"message":%q,"domain":"usageLimits","reason":"rateLimitExceeded"}]}}`, msg, msg)
}

// objectOf is the object, bucket/name, a Cloud Storage write changes ("" for
// a request that changes no object): an upload (the name in the query),
// a metadata update or delete, a compose, or the destination of a copy or
// rewrite; JSON or XML API.
func objectOf(method, path string) string {
	p, query, _ := strings.Cut(path, "?")
	if rest, ok := strings.CutPrefix(p, "/upload/storage/v1/b/"); ok {
		bucket, _, _ := strings.Cut(rest, "/")
		q, _ := url.ParseQuery(query)
		if name := q.Get("name"); name != "" {
			return bucket + "/" + name
		}
		return "" // a resumable upload's later requests name the session only
	}
	if rest, ok := strings.CutPrefix(p, "/storage/v1/b/"); ok {
		for _, to := range []string{"/copyTo/b/", "/rewriteTo/b/"} {
			if _, dest, ok := strings.Cut(rest, to); ok {
				rest = dest
			}
		}
		bucket, obj, ok := strings.Cut(rest, "/o/")
		if !ok {
			return "" // the bucket, or a listing
		}
		obj = strings.TrimSuffix(obj, "/compose")
		if name, err := url.PathUnescape(obj); err == nil && name != "" {
			return bucket + "/" + name
		}
		return ""
	}
	if method == http.MethodPut || method == http.MethodDelete { // XML API: /bucket/object
		bucket, obj, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/")
		if name, err := url.PathUnescape(obj); ok && err == nil && name != "" {
			return bucket + "/" + name
		}
	}
	return ""
}
