// Package strictgcs holds the local cloud's Cloud Storage (fake-gcs-server)
// to what Cloud Storage enforces and fake-gcs-server does not:
//
//   - metagenerations: fake-gcs-server reports 1 for every object; Cloud
//     Storage starts each generation's metageneration at 1 and adds one on
//     every metadata update (patch or update of the object resource)
//     (https://cloud.google.com/storage/docs/metadata#generation-number).
//     The gate keeps the count, by bucket, object and generation, and
//     writes it into the object resources and download headers it passes
//     back;
//   - preconditions fake-gcs-server ignores: ifMetagenerationMatch and
//     ifMetagenerationNotMatch on every request, the destination's
//     preconditions on a rewrite, copy or compose, the source's on a
//     rewrite or copy, and every precondition on a read, metadata update
//     or delete. The gate evaluates every precondition of a request on an
//     object, as Cloud Storage does
//     (https://cloud.google.com/storage/docs/request-preconditions): a
//     match that fails is refused with 412 conditionNotMet, a not-match
//     that fails with 304 Not Modified; a read, update or delete of an
//     object that does not exist gets the service's 404, whatever its
//     preconditions; a write that would create the object fails
//     ifGenerationMatch other than 0 and any ifMetagenerationMatch.
//
// A precondition check and the request it guards are atomic with respect
// to every other request through the gate for the same object: the gate
// holds a lock per object from the check until the service has answered.
// Every client of the service must therefore reach it through the gate: the
// functions through their doors (faults.Proxy.SetGate), everything else
// through Serve.
package strictgcs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Gate keeps metagenerations and enforces preconditions for one
// fake-gcs-server. Its zero value is not usable: see New.
type Gate struct {
	upstream *url.URL
	hc       *http.Client

	mu    sync.Mutex
	locks map[string]*objectLock
	// metagen is the metageneration of each generation whose metadata was
	// updated through the gate; any other has metageneration 1.
	metagen map[version]int64
	// sessions are the resumable uploads begun through the gate, by upload
	// id, with the preconditions they were begun under.
	sessions map[string]conds
}

type version struct {
	bucket, name string
	generation   int64
}

type objectLock struct {
	mu   sync.Mutex
	refs int
}

// New returns the gate of the fake-gcs-server at upstream
// (http://host:port).
func New(upstream string) (*Gate, error) {
	u, err := url.Parse(upstream)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("strictgcs: upstream %q is not a URL", upstream)
	}
	return &Gate{
		upstream: u,
		hc:       &http.Client{Timeout: 30 * time.Second},
		locks:    map[string]*objectLock{},
		metagen:  map[version]int64{},
		sessions: map[string]conds{},
	}, nil
}

// Serve serves the gate in front of the service on a listener of
// 127.0.0.1, for clients that have no door of their own (the test harness,
// the simulators); it returns the listener's address, host:port, and a
// function that closes it.
func (g *Gate) Serve() (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	u := g.upstream
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = u.Host
		},
		FlushInterval: -1,
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.Handle(w, r, rp) }),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = srv.Serve(l) }()
	return l.Addr().String(), func() { _ = srv.Close() }, nil
}

// Handle answers r itself when Cloud Storage would refuse it for a
// precondition, or else sends it on through forward and passes the answer
// back with the objects' true metagenerations. It is a faults.Gate.
func (g *Gate) Handle(w http.ResponseWriter, r *http.Request, forward http.Handler) {
	o, err := parse(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	if o.kind == other {
		forward.ServeHTTP(w, r)
		return
	}
	if o.kind == upload {
		g.mu.Lock()
		o.conds = g.sessions[o.session]
		g.mu.Unlock()
	}
	unlock := g.lock(o.keys()...)
	defer unlock()
	if status := g.check(r.Context(), o); status != 0 {
		answerRefusal(w, status, o.xml)
		return
	}
	switch o.kind {
	case read:
		if o.media {
			forward.ServeHTTP(&metagenHeader{ResponseWriter: w, g: g, bucket: o.target.bucket, name: o.target.name}, r)
			return
		}
		g.forwardEdited(w, r, forward, func(b []byte) ([]byte, error) { return g.editObject(b, false) })
	case list:
		g.forwardEdited(w, r, forward, g.editList)
	case update:
		g.forwardEdited(w, r, forward, func(b []byte) ([]byte, error) { return g.editObject(b, true) })
	case insert:
		if !o.resumable {
			forward.ServeHTTP(w, r)
			return
		}
		sw := &sessionWriter{ResponseWriter: w}
		forward.ServeHTTP(sw, r)
		if id := sw.uploadID(); id != "" {
			g.mu.Lock()
			g.sessions[id] = o.conds
			g.mu.Unlock()
		}
	default:
		forward.ServeHTTP(w, r)
	}
}

// lock takes the locks of the objects keys name, in order, and returns the
// function that releases them.
func (g *Gate) lock(keys ...string) func() {
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var held []*objectLock
	for _, k := range keys {
		g.mu.Lock()
		l := g.locks[k]
		if l == nil {
			l = &objectLock{}
			g.locks[k] = l
		}
		l.refs++
		g.mu.Unlock()
		l.mu.Lock()
		held = append(held, l)
	}
	return func() {
		for i, l := range held {
			l.mu.Unlock()
			g.mu.Lock()
			if l.refs--; l.refs == 0 {
				delete(g.locks, keys[i])
			}
			g.mu.Unlock()
		}
	}
}

// check evaluates the request's preconditions against the objects as they
// are now: 0 when they hold (or when the service itself answers, as for an
// object that does not exist), else the status Cloud Storage refuses with.
func (g *Gate) check(ctx context.Context, o op) int {
	if o.kind == list {
		return 0
	}
	if !o.sourceConds.empty() {
		st, err := g.state(ctx, o.source)
		if err != nil || !st.exists {
			return 0 // the service answers: 404, or its own error
		}
		if status := o.sourceConds.verdict(st); status != 0 {
			return status
		}
	}
	if o.conds.empty() {
		return 0
	}
	st, err := g.state(ctx, o.target)
	if err != nil {
		return 0
	}
	if !st.exists {
		switch o.kind {
		case read, update, remove:
			return 0 // the service's 404
		}
		// A write that creates the object: its generation and
		// metageneration are 0, and no metageneration can match.
		if o.conds.metaMatch != nil {
			return http.StatusPreconditionFailed
		}
	}
	return o.conds.verdict(st)
}

// state is what the service holds of an object now.
type state struct {
	exists                     bool
	generation, metageneration int64
}

// state reads obj's generation from the service and its metageneration
// from the gate's table.
func (g *Gate) state(ctx context.Context, obj object) (state, error) {
	u := *g.upstream
	u.Path = "/storage/v1/b/" + obj.bucket + "/o/" + obj.name
	u.RawPath = "/storage/v1/b/" + url.PathEscape(obj.bucket) + "/o/" + url.PathEscape(obj.name)
	if obj.generation != 0 {
		u.RawQuery = "generation=" + strconv.FormatInt(obj.generation, 10)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return state{}, err
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		return state{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return state{}, nil
	default:
		return state{}, fmt.Errorf("look up %s/%s: %s", obj.bucket, obj.name, resp.Status)
	}
	var res struct {
		Generation string `json:"generation"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return state{}, fmt.Errorf("look up %s/%s: %w", obj.bucket, obj.name, err)
	}
	gen, err := strconv.ParseInt(res.Generation, 10, 64)
	if err != nil {
		return state{}, fmt.Errorf("look up %s/%s: generation %q", obj.bucket, obj.name, res.Generation)
	}
	return state{exists: true, generation: gen, metageneration: g.metageneration(version{obj.bucket, obj.name, gen})}, nil
}

func (g *Gate) metageneration(v version) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m, ok := g.metagen[v]; ok {
		return m
	}
	return 1
}

// forwardEdited forwards r and passes back the service's answer with its
// body edited by edit when it is a success.
func (g *Gate) forwardEdited(w http.ResponseWriter, r *http.Request, forward http.Handler, edit func([]byte) ([]byte, error)) {
	c := &captured{header: http.Header{}}
	forward.ServeHTTP(c, r)
	if c.status == 0 {
		c.status = http.StatusOK
	}
	body := c.body.Bytes()
	if c.status == http.StatusOK && r.Method != http.MethodHead {
		if b, err := edit(body); err == nil {
			body = b
		}
	}
	for k, v := range c.header {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(c.status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// editObject writes the true metageneration into an object resource; bump
// first counts a metadata update of it.
func (g *Gate) editObject(b []byte, bump bool) ([]byte, error) {
	var res map[string]json.RawMessage
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, err
	}
	if err := g.editResource(res, bump); err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

func (g *Gate) editList(b []byte) ([]byte, error) {
	var res map[string]json.RawMessage
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, err
	}
	if len(res["items"]) == 0 {
		return b, nil
	}
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(res["items"], &items); err != nil {
		return nil, err
	}
	for _, it := range items {
		if err := g.editResource(it, false); err != nil {
			return nil, err
		}
	}
	raw, err := json.Marshal(items)
	if err != nil {
		return nil, err
	}
	res["items"] = raw
	return json.Marshal(res)
}

func (g *Gate) editResource(res map[string]json.RawMessage, bump bool) error {
	var bucket, name, gen string
	for k, p := range map[string]*string{"bucket": &bucket, "name": &name, "generation": &gen} {
		if err := json.Unmarshal(res[k], p); err != nil {
			return fmt.Errorf("object resource without %s", k)
		}
	}
	generation, err := strconv.ParseInt(gen, 10, 64)
	if err != nil {
		return err
	}
	v := version{bucket, name, generation}
	g.mu.Lock()
	m, ok := g.metagen[v]
	if !ok {
		m = 1
	}
	if bump {
		m++
		g.metagen[v] = m
	}
	g.mu.Unlock()
	res["metageneration"], _ = json.Marshal(strconv.FormatInt(m, 10))
	return nil
}

// captured holds an answer to edit before it is passed back.
type captured struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *captured) Header() http.Header { return c.header }

func (c *captured) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

func (c *captured) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	return c.body.Write(b)
}

// Flush does nothing: the answer is passed back whole.
func (c *captured) Flush() {}

// metagenHeader passes back a download with the object's true
// metageneration in X-Goog-Metageneration, which the client library reads
// into the reader's attributes.
type metagenHeader struct {
	http.ResponseWriter
	g            *Gate
	bucket, name string
	wrote        bool
}

func (m *metagenHeader) WriteHeader(status int) {
	if !m.wrote {
		m.wrote = true
		h := m.Header()
		if gen, err := strconv.ParseInt(h.Get("X-Goog-Generation"), 10, 64); err == nil {
			h.Set("X-Goog-Metageneration", strconv.FormatInt(m.g.metageneration(version{m.bucket, m.name, gen}), 10))
		}
	}
	m.ResponseWriter.WriteHeader(status)
}

func (m *metagenHeader) Write(b []byte) (int, error) {
	if !m.wrote {
		m.WriteHeader(http.StatusOK)
	}
	return m.ResponseWriter.Write(b)
}

func (m *metagenHeader) Unwrap() http.ResponseWriter { return m.ResponseWriter }

// sessionWriter notes the upload id of a resumable upload the service
// began.
type sessionWriter struct {
	http.ResponseWriter
}

func (s *sessionWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *sessionWriter) uploadID() string {
	loc, err := url.Parse(s.Header().Get("Location"))
	if err != nil {
		return ""
	}
	return loc.Query().Get("upload_id")
}

// preconditionFailed is Cloud Storage's JSON API answer to a request whose
// match precondition does not hold
// (https://cloud.google.com/storage/docs/json_api/v1/status-codes#412_Precondition_Failed).
const preconditionFailed = "At least one of the pre-conditions you specified did not hold."

// answerRefusal answers a request refused for a precondition: 412 with
// the JSON API's (or the XML API's) error, or 304 with no body.
func answerRefusal(w http.ResponseWriter, status int, xml bool) {
	if status == http.StatusNotModified {
		w.WriteHeader(status)
		return
	}
	if xml {
		w.Header().Set("Content-Type", "application/xml; charset=UTF-8")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "<?xml version='1.0' encoding='UTF-8'?><Error><Code>PreconditionFailed</Code><Message>"+preconditionFailed+"</Message></Error>")
		return
	}
	writeError(w, status, "conditionNotMet", preconditionFailed)
}

// writeError answers with the JSON API's error body.
func writeError(w http.ResponseWriter, status int, reason, message string) {
	item := map[string]string{"message": message, "domain": "global", "reason": reason}
	if reason == "conditionNotMet" {
		item["locationType"] = "header"
		item["location"] = "If-Match"
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": status, "message": message, "errors": []any{item}}})
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
