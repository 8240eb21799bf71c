// Package faults puts a recording, fault-injecting HTTP proxy between the
// functions of the local cloud and a service they call: the Kubernetes API
// server or Cloud Storage (fake-gcs-server).
//
// Each client (one function) gets its own door, a listener on 127.0.0.1, so
// every request is known by the client that sent it, and a door may carry
// its client's own credentials to the service (DoorWith): the door is the
// client's identity. The proxy forwards each request to the service
// unchanged and records it; on demand it
//
//   - answers a share of writes with 409 Conflict instead of forwarding them,
//     with the Status body the API server itself sends for a write that lost
//     a race (SetConflictShare);
//   - goes down: every door stops listening and every open connection is cut,
//     so clients get "connection refused" as from a stopped server, until Up
//     reopens the doors on the same addresses (Down, Up);
//   - refuses, with 429, a write to a resource written less than an interval
//     before (LimitWrites): Cloud Storage's limit on writes to one object;
//   - calls a hook after the service answered a request and before the
//     client gets the answer, where a test kills the client's process: the
//     write took effect, and the process dies mid-handler (SetHook);
//   - passes every request it would forward through a gate, which may
//     answer it itself or edit the service's answer: what the real service
//     checks and its stand-in does not (SetGate).
//
// It stands for faults of the network and of the services as seen by the
// functions; the services themselves, and everything else that talks to them
// directly (KubeRay's reconcilers, the simulators), keep running.
package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Request is one request a client sent through the proxy.
type Request struct {
	Client string
	Method string
	Path   string // with the query: a Cloud Storage upload names its object there
	Status int    // the answer's status code; 0 when the service gave none
	Write  bool   // any method but GET, HEAD and OPTIONS
	// Injected says the proxy answered (a 409, a refusal) without forwarding.
	Injected bool
	At       time.Time
}

// Proxy is a recording, fault-injecting reverse proxy to one service.
type Proxy struct {
	name     string
	upstream *url.URL
	rp       *httputil.ReverseProxy

	mu       sync.Mutex
	doors    map[string]*door
	down     bool
	share    float64
	rng      *rand.Rand
	hook     func(Request)
	requests []Request
	denials  []denial
	// transports are the clients' own (DoorWith); others use the default.
	transports map[string]http.RoundTripper
	limit      *writeLimit
	gate       Gate
}

// A Gate stands between the doors and the service: it gets every request
// the proxy would forward, and either answers it itself, as the real
// service would (a request the service's stand-in would let through), or
// calls forward, which sends it to the service and writes the answer to
// the writer it is given. A request the gate answers is recorded as
// injected.
type Gate func(w http.ResponseWriter, r *http.Request, forward http.Handler)

// writeLimit is LimitWrites' rule and what it has seen.
type writeLimit struct {
	every  time.Duration
	key    func(method, path string) string
	refuse func(key string) string
	// last is when the last successful write of each resource arrived.
	last map[string]time.Time
	// refused are the writes refused, kept across Reset.
	refused []Request
}

// Refusal answers a request (method, path with the query) that the service
// refuses the client, as a service refuses an identity without the
// permission, with its status and body; status 0 lets it through.
type Refusal func(method, path string) (status int, body string)

// denial is a client's refusal.
type denial struct {
	client string
	refuse Refusal
}

type door struct {
	addr string
	l    net.Listener
	srv  *http.Server
}

// New returns a proxy named name (used in messages) to the service at
// upstream, reached through rt (nil: http.DefaultTransport).
func New(name, upstream string, rt http.RoundTripper) (*Proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("faults: upstream %q is not a URL", upstream)
	}
	if rt == nil {
		rt = http.DefaultTransport
	}
	p := &Proxy{name: name, upstream: u, doors: map[string]*door{}, rng: rand.New(rand.NewPCG(1, 2)), transports: map[string]http.RoundTripper{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = u.Host
		},
		Transport:     clientTransport{p, rt},
		FlushInterval: -1, // watches and streamed bodies pass through at once
		// The hook runs once the service answered, before the answer is
		// written back: ModifyResponse is the last point with both.
		ModifyResponse: func(resp *http.Response) error {
			req, ok := resp.Request.Context().Value(requestKey{}).(*Request)
			if !ok {
				return nil
			}
			req.Status = resp.StatusCode
			p.wrote(*req)
			p.record(*req)
			p.mu.Lock()
			hook := p.hook
			p.mu.Unlock()
			if hook != nil {
				hook(*req)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, p.name+" unreachable: "+err.Error(), http.StatusBadGateway)
		},
	}
	return p, nil
}

// Door opens the client's door and returns its address, 127.0.0.1:port.
func (p *Proxy) Door(client string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if d, ok := p.doors[client]; ok {
		return d.addr, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	d := &door{addr: l.Addr().String()}
	p.doors[client] = d
	p.serve(client, d, l)
	return d.addr, nil
}

// DoorWith opens the client's door, as Door, and forwards its requests
// through rt: the client's own credentials, so the service authenticates
// and authorizes the client, not the proxy.
func (p *Proxy) DoorWith(client string, rt http.RoundTripper) (string, error) {
	p.mu.Lock()
	p.transports[client] = rt
	p.mu.Unlock()
	return p.Door(client)
}

// clientTransport forwards a request through its client's transport.
type clientTransport struct {
	p    *Proxy
	base http.RoundTripper
}

func (c clientTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rt := c.base
	if req, ok := r.Context().Value(requestKey{}).(*Request); ok {
		c.p.mu.Lock()
		if own, ok := c.p.transports[req.Client]; ok {
			rt = own
		}
		c.p.mu.Unlock()
	}
	return rt.RoundTrip(r)
}

func (p *Proxy) serve(client string, d *door, l net.Listener) {
	d.l = l
	d.srv = &http.Server{Handler: p.handler(client), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = d.srv.Serve(l) }()
}

// SetConflictShare makes the proxy answer that share (0..1) of writes with
// 409 Conflict instead of forwarding them; 0 stops it.
func (p *Proxy) SetConflictShare(share float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.share = share
}

// SetHook sets the function called after each answered request, before the
// client gets the answer; nil removes it. It runs on the request's goroutine.
func (p *Proxy) SetHook(f func(Request)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hook = f
}

// SetGate sets the gate every forwarded request passes through; nil
// removes it.
func (p *Proxy) SetGate(g Gate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = g
}

// Down closes every door and cuts every open connection.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for _, d := range p.doors {
		_ = d.l.Close() // Serve may not have taken it yet
		_ = d.srv.Close()
	}
}

// Up reopens every door on its address.
func (p *Proxy) Up() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.down {
		return nil
	}
	var errs []error
	for client, d := range p.doors {
		var l net.Listener
		var err error
		for range 50 { // the port may take a moment to be free again
			if l, err = net.Listen("tcp", d.addr); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reopen %s door of %s: %w", p.name, client, err))
			continue
		}
		p.serve(client, d, l)
	}
	p.down = false
	return errors.Join(errs...)
}

// Close closes every door for good.
func (p *Proxy) Close() {
	p.Down()
}

// Requests returns the requests recorded since the last Reset.
func (p *Proxy) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.requests...)
}

// Reset forgets the recorded requests.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = nil
}

func isWrite(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

func (p *Proxy) handler(client string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := Request{Client: client, Method: r.Method, Path: r.URL.RequestURI(), Write: isWrite(r.Method), At: time.Now()}
		p.mu.Lock()
		inject := req.Write && p.share > 0 && p.rng.Float64() < p.share
		status, body := p.refused(client, req.Method, req.Path)
		if status == 0 {
			if body = p.limited(req); body != "" {
				status = http.StatusTooManyRequests
			}
		}
		gate := p.gate
		p.mu.Unlock()
		if status != 0 {
			req.Status, req.Injected = status, true
			p.record(req)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
			return
		}
		if inject {
			req.Status, req.Injected = http.StatusConflict, true
			p.record(req)
			writeConflict(w, r)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), requestKey{}, &req))
		if gate == nil {
			p.rp.ServeHTTP(w, r)
		} else {
			forwarded := false
			sw := &statusWriter{ResponseWriter: w}
			gate(sw, r, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				forwarded = true
				p.rp.ServeHTTP(w, r)
			}))
			if !forwarded {
				req.Status, req.Injected = sw.status, true
				p.record(req)
				return
			}
		}
		if req.Status == 0 {
			p.record(req) // the service gave no answer
		}
	})
}

// LimitWrites makes the proxy refuse a write, with 429 and the body refuse
// gives, when the last successful write of the same resource (key names
// it; "" for a request the limit does not apply to) arrived less than every
// before, from any client. Only writes that succeeded count, as only they
// change the resource.
func (p *Proxy) LimitWrites(every time.Duration, key func(method, path string) string, refuse func(key string) string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limit = &writeLimit{every: every, key: key, refuse: refuse, last: map[string]time.Time{}}
}

// limited is the body of a refusal of req for the write limit ("" when
// the write may go); p.mu is held.
func (p *Proxy) limited(req Request) string {
	l := p.limit
	if l == nil || !req.Write {
		return ""
	}
	k := l.key(req.Method, req.Path)
	if last, ok := l.last[k]; k != "" && ok && req.At.Sub(last) < l.every {
		req.Status, req.Injected = http.StatusTooManyRequests, true
		l.refused = append(l.refused, req)
		return l.refuse(k)
	}
	return ""
}

// LimitRefusals returns every write LimitWrites refused since it was set,
// whatever Reset forgot.
func (p *Proxy) LimitRefusals() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.limit == nil {
		return nil
	}
	return append([]Request(nil), p.limit.refused...)
}

// wrote notes a successful write for the write limit.
func (p *Proxy) wrote(req Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.limit
	if l == nil || !req.Write || req.Status < 200 || req.Status > 299 {
		return
	}
	if k := l.key(req.Method, req.Path); k != "" && req.At.After(l.last[k]) {
		l.last[k] = req.At
	}
}

// Refuse makes the proxy answer client's requests that refuse refuses
// without forwarding them. Refusals add up: the first that refuses answers.
func (p *Proxy) Refuse(client string, refuse Refusal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.denials = append(p.denials, denial{client, refuse})
}

// refused is the answer to a client's refused request (status 0: not
// refused); p.mu is held.
func (p *Proxy) refused(client, method, path string) (int, string) {
	for _, d := range p.denials {
		if d.client != client {
			continue
		}
		if status, body := d.refuse(method, path); status != 0 {
			return status, body
		}
	}
	return 0, ""
}

// requestKey carries a request's record from the handler to ModifyResponse.
type requestKey struct{}

func (p *Proxy) record(r Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = append(p.requests, r)
}

// writeConflict answers as the API server does when a write loses a race.
func writeConflict(w http.ResponseWriter, r *http.Request) {
	resource := r.URL.Path
	if i := strings.LastIndex(resource, "/"); i >= 0 {
		resource = resource[i+1:]
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusConflict)
	_, _ = fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",`+
		`"message":"Operation cannot be fulfilled on %s: the object has been modified; please apply your changes to the latest version and try again",`+
		`"reason":"Conflict","details":{"name":%q},"code":409}`, r.URL.Path, resource)
}

// statusWriter notes the status a gate answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer (to
// flush a streamed answer).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
