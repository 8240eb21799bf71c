package strictgcs

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// kind is what a request does to objects.
type kind int

const (
	other   kind = iota // nothing the gate looks at (buckets, ACLs, notifications...)
	read                // an object's resource or data
	list                // a bucket's objects
	update              // an object's metadata (patch or update)
	remove              // delete
	insert              // an upload, or the start of a resumable one
	upload              // a later request of a resumable upload
	rewrite             // rewrite or copy
	compose
)

// object names one object (generation 0: the live one).
type object struct {
	bucket, name string
	generation   int64
}

func (o object) key() string { return o.bucket + "/" + o.name }

// conds are a request's preconditions on one object; nil: not given.
type conds struct {
	genMatch, genNotMatch, metaMatch, metaNotMatch *int64
}

func (c conds) empty() bool {
	return c.genMatch == nil && c.genNotMatch == nil && c.metaMatch == nil && c.metaNotMatch == nil
}

// verdict is the status Cloud Storage refuses a request with whose
// preconditions c are evaluated against st (0: they hold): a match that
// fails is 412 Precondition Failed, a not-match that fails 304 Not
// Modified (https://cloud.google.com/storage/docs/request-preconditions).
func (c conds) verdict(st state) int {
	switch {
	case c.genMatch != nil && *c.genMatch != st.generation,
		c.metaMatch != nil && *c.metaMatch != st.metageneration:
		return http.StatusPreconditionFailed
	case c.genNotMatch != nil && *c.genNotMatch == st.generation,
		c.metaNotMatch != nil && *c.metaNotMatch == st.metageneration:
		return http.StatusNotModified
	}
	return 0
}

// op is a request as the gate sees it.
type op struct {
	kind   kind
	target object // the object read, changed or written
	conds  conds  // on target
	// source and sourceConds: a rewrite's or copy's source.
	source      object
	sourceConds conds
	media       bool   // a read of the object's data (its metageneration goes in a header)
	xml         bool   // an XML API request: errors in XML
	resumable   bool   // an insert that begins a resumable upload
	session     string // upload: the resumable upload's id
}

// keys are the objects whose locks the request holds.
func (o op) keys() []string {
	switch o.kind {
	case other, list:
		return nil
	case rewrite:
		return []string{o.source.key(), o.target.key()}
	}
	return []string{o.target.key()}
}

// parse classifies a request of the JSON API (as the Go client and
// fake-gcs-server's routes name them) or an XML API read.
func parse(r *http.Request) (op, error) {
	q := r.URL.Query()
	path := r.URL.EscapedPath()
	media := false
	if p, ok := strings.CutPrefix(path, "/upload"); ok {
		return parseUpload(r.Method, p, q)
	}
	if p, ok := strings.CutPrefix(path, "/download"); ok {
		path, media = p, true
	}
	rest, ok := strings.CutPrefix(path, "/storage/v1/b/")
	if !ok {
		return parseXML(r, path)
	}
	bucket, rest, ok := strings.Cut(rest, "/")
	if !ok || bucket == "" {
		return op{}, nil // the bucket itself
	}
	if rest == "o" || rest == "o/" {
		if r.Method == http.MethodGet {
			return op{kind: list}, nil
		}
		return op{}, nil
	}
	rest, ok = strings.CutPrefix(rest, "o/")
	if !ok {
		return op{}, nil // ACLs, notifications, IAM...
	}
	segs := strings.Split(rest, "/")
	target, err := objectAt(bucket, segs[0], q.Get("generation"))
	if err != nil {
		return op{}, err
	}
	c, err := condsOf(q, "")
	if err != nil {
		return op{}, err
	}
	o := op{target: target, conds: c}
	switch {
	case len(segs) == 1:
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			// fake-gcs-server answers a HEAD as a download: headers only.
			o.kind, o.media = read, media || q.Get("alt") == "media" || r.Method == http.MethodHead
		case http.MethodPatch, http.MethodPut, http.MethodPost:
			o.kind = update
		case http.MethodDelete:
			o.kind = remove
		}
		return o, nil
	case len(segs) == 2 && segs[1] == "compose" && r.Method == http.MethodPost:
		o.kind, o.target.generation = compose, 0
		return o, nil
	case len(segs) == 6 && (segs[1] == "rewriteTo" || segs[1] == "copyTo") && segs[2] == "b" && segs[4] == "o" && r.Method == http.MethodPost:
		src, err := objectAt(bucket, segs[0], q.Get("sourceGeneration"))
		if err != nil {
			return op{}, err
		}
		dst, err := objectAt(segs[3], segs[5], "")
		if err != nil {
			return op{}, err
		}
		sc, err := condsOf(q, "Source")
		if err != nil {
			return op{}, err
		}
		return op{kind: rewrite, target: dst, conds: c, source: src, sourceConds: sc}, nil
	}
	return op{}, nil
}

// parseUpload classifies a request under /upload: an insert (the object's
// name in the query, as the Go client and the Location of a resumable
// upload give it), or a later request of a resumable upload.
func parseUpload(method, path string, q url.Values) (op, error) {
	rest, ok := strings.CutPrefix(path, "/storage/v1/b/")
	if !ok {
		return op{}, nil
	}
	bucket, rest, _ := strings.Cut(rest, "/")
	name := q.Get("name")
	if (rest != "o" && rest != "o/") || name == "" {
		return op{}, nil
	}
	target := object{bucket: bucket, name: name}
	if id := q.Get("upload_id"); id != "" {
		if method == http.MethodDelete {
			return op{}, nil // cancelling the upload
		}
		return op{kind: upload, target: target, session: id}, nil
	}
	if method != http.MethodPost {
		return op{}, nil
	}
	c, err := condsOf(q, "")
	if err != nil {
		return op{}, err
	}
	return op{kind: insert, target: target, conds: c, resumable: q.Get("uploadType") == "resumable"}, nil
}

// parseXML classifies an XML API request: only reads of an object
// (/bucket/object, the Go client's reads) are looked at, with their
// x-goog-if-*-match headers.
func parseXML(r *http.Request, path string) (op, error) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return op{}, nil
	}
	bucket, name, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if !ok || bucket == "" || name == "" || strings.HasPrefix(bucket, "_") || bucket == "storage" || bucket == "batch" {
		return op{}, nil
	}
	target, err := objectAt(bucket, name, r.URL.Query().Get("generation"))
	if err != nil {
		return op{}, err
	}
	var c conds
	for h, p := range map[string]**int64{"X-Goog-If-Generation-Match": &c.genMatch, "X-Goog-If-Metageneration-Match": &c.metaMatch} {
		if v := r.Header.Get(h); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return op{}, fmt.Errorf("invalid %s: %q", h, v)
			}
			*p = &n
		}
	}
	return op{kind: read, target: target, conds: c, media: true, xml: true}, nil
}

func objectAt(bucket, escapedName, generation string) (object, error) {
	name, err := url.PathUnescape(escapedName)
	if err != nil || name == "" {
		return object{}, errors.New("invalid object name")
	}
	o := object{bucket: bucket, name: name}
	if generation != "" {
		if o.generation, err = strconv.ParseInt(generation, 10, 64); err != nil {
			return object{}, fmt.Errorf("invalid generation: %q", generation)
		}
	}
	return o, nil
}

// condsOf reads the if[Source]{Generation,Metageneration}[Not]Match
// parameters; source is "" or "Source".
func condsOf(q url.Values, source string) (conds, error) {
	var c conds
	for name, p := range map[string]**int64{
		"GenerationMatch":        &c.genMatch,
		"GenerationNotMatch":     &c.genNotMatch,
		"MetagenerationMatch":    &c.metaMatch,
		"MetagenerationNotMatch": &c.metaNotMatch,
	} {
		param := "if" + source + name
		if !q.Has(param) {
			continue
		}
		n, err := strconv.ParseInt(q.Get(param), 10, 64)
		if err != nil {
			return conds{}, fmt.Errorf("invalid %s: %q", param, q.Get(param))
		}
		*p = &n
	}
	return c, nil
}
