package subscriber

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/events"
)

// ManifestFile is written last into a promotion's folder: it says which run
// and checkpoint the files beside it came from.
const ManifestFile = "manifest.json"

// Custom metadata every promoted object carries: the run it belongs to, the
// instant the run ended (which orders promotions), the event that promoted
// it, and where a copied file came from.
const (
	MetaRunID            = "raydrop-run-id"
	MetaEndedAt          = "raydrop-ended-at"
	MetaEventID          = "raydrop-event-id"
	MetaSource           = "raydrop-source"
	MetaSourceGeneration = "raydrop-source-generation"
)

// cacheControl keeps caches from serving a replaced file: Cloud Storage lets
// caches keep a publicly readable object an hour by default
// (https://cloud.google.com/storage/docs/caching), and latest/ is replaced
// in place.
const cacheControl = "no-cache"

// Time limits: each Cloud Storage request, and a whole copy, which may take
// several rewrite requests when the buckets differ in location or storage
// class (https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite),
// well inside the function's timeout.
const (
	callTimeout = 30 * time.Second
	copyTimeout = 5 * time.Minute
)

// tries bounds how often one object's write is decided again after losing a
// race (a failed precondition). Each loss means another promotion wrote the
// object; only a run older than every other one meets more than a few.
const tries = 8

// Outcome is what a promotion did.
type Outcome string

// Outcomes.
const (
	// Promoted: the run's files and manifest are in latest/.
	Promoted Outcome = "promoted"
	// Duplicate: an earlier delivery promoted the run; nothing was written.
	Duplicate Outcome = "duplicate"
	// Superseded: a run that ended later holds latest/, or is writing it;
	// nothing of this run was kept.
	Superseded Outcome = "superseded"
)

// Result is a promotion's outcome.
type Result struct {
	Outcome Outcome
	// Current is the run found in latest/ (Duplicate, Superseded).
	Current string
	// Manifest is what was written (Promoted).
	Manifest *Manifest
}

// Manifest is manifest.json: the run, the checkpoint and the files.
type Manifest struct {
	RunID   string    `json:"runId"`
	Name    string    `json:"name"`
	EventID string    `json:"eventId"`
	EndedAt time.Time `json:"endedAt"`
	// Source is the job spec the run came from.
	Source string `json:"source,omitempty"`
	// Checkpoint is the promoted checkpoint's name (checkpoint_00000N),
	// CheckpointURI its folder, Selected the event field it was taken from:
	// bestCheckpoint, or latestCheckpoint when the event names no best.
	Checkpoint    string             `json:"checkpoint"`
	CheckpointURI string             `json:"checkpointUri"`
	Selected      string             `json:"selected"`
	Step          int64              `json:"step"`
	Epoch         float64            `json:"epoch"`
	BestBy        string             `json:"bestBy,omitempty"`
	Metrics       map[string]float64 `json:"metrics"`
	FinalMetrics  map[string]float64 `json:"finalMetrics,omitempty"`
	Files         []File             `json:"files"`
}

// File is one promoted file. Generation is the copy's object generation: a
// reader that reads each file at it gets exactly the files the manifest
// describes, or an error if a newer promotion has replaced them since.
type File struct {
	Name             string `json:"name"`
	URI              string `json:"uri"`
	Generation       int64  `json:"generation"`
	Size             int64  `json:"size"`
	SourceURI        string `json:"sourceUri"`
	SourceGeneration int64  `json:"sourceGeneration"`
}

// Promote copies the adapter of the run's chosen checkpoint into
// <Prefix>/<name>/latest/ and writes the manifest there, unless the folder
// already holds this run or a newer one.
//
// Runs are ordered by the instant they ended (endedAt), then by run ID, and
// every object Promote writes records its run's place in that order in its
// custom metadata (MetaRunID, MetaEndedAt). Each object is written only over
// an absent or older object, and the check and the write are one atomic step
// on the server: the write carries the request precondition ifGenerationMatch
// with the generation just read, or 0 for an object that should not exist
// yet, so Cloud Storage refuses it (412) if anyone wrote the object in
// between, and Promote reads the object again and decides again
// (https://cloud.google.com/storage/docs/request-preconditions and
// https://cloud.google.com/storage/docs/generations-preconditions). A newer
// run's object is therefore never replaced, whatever the timing, and every
// object ends with the newest run that reached it. The files are written in
// one fixed order, each promotion writes every file of the fixed set
// (checkpoints.AdapterFiles), and the manifest comes last:
//   - a redelivered event finds its own manifest and writes nothing; one
//     whose earlier delivery died midway skips the files already copied;
//   - an older run's event finds a newer manifest (or, while that run is
//     still copying, a newer file) and stops;
//   - of two runs promoted at once, the newer one overwrites each file the
//     older one wrote and writes its manifest last, so latest/ ends with the
//     newer run's files and manifest only.
//
// Only the adapter is copied: the optimizer, scheduler and RNG states are
// for resuming training, and the processor files a checkpoint also holds
// are the base model's, which adapter_config.json names. A fixed set is
// what keeps the rules above simple: a promotion that copied whatever files
// its checkpoint held would also have to delete those an older run left,
// and a delete cannot carry a newer run's stamp to stop an older copy
// recreating the file.
func (h *Handler) Promote(ctx context.Context, run events.Run, eventID string) (Result, error) {
	if err := check(run); err != nil {
		return Result{}, Permanent(fmt.Errorf("run %s: %w", run.RunID, err))
	}
	ck := chosen(run)
	srcBucket, srcFolder, _ := parseGS(ck.URI)
	st := stamp{runID: run.RunID, endedAt: run.EndedAt.UTC()}
	folder := h.folder(run.Name)
	dst := h.Storage.Bucket(h.Bucket)
	manifest := dst.Object(folder + ManifestFile)

	// A redelivery, and an older run's event, stop here, having read the
	// attributes of one object.
	a, err := attrsOf(ctx, manifest)
	if err != nil {
		return Result{}, fmt.Errorf("read %s: %w", h.uri(manifest.ObjectName()), err)
	}
	if a != nil {
		switch cur := stampOf(a.Metadata); {
		case cur.same(st):
			return Result{Outcome: Duplicate, Current: cur.runID}, nil
		case cur.after(st):
			return Result{Outcome: Superseded, Current: cur.runID}, nil
		}
	}

	// Every file of the adapter first: a checkpoint without one is
	// refused before anything is copied.
	srcs := make([]*storage.ObjectAttrs, len(checkpoints.AdapterFiles))
	for i, name := range checkpoints.AdapterFiles {
		src := h.Storage.Bucket(srcBucket).Object(srcFolder + "/" + name)
		sa, err := attrsOf(ctx, src)
		if err != nil {
			return Result{}, fmt.Errorf("read gs://%s/%s: %w", srcBucket, src.ObjectName(), sourceError(err))
		}
		if sa == nil {
			return Result{}, Permanent(fmt.Errorf("checkpoint %s holds no %s", ck.URI, name))
		}
		srcs[i] = sa
	}

	m := newManifest(run, ck, eventID)
	for i, name := range checkpoints.AdapterFiles {
		sa := srcs[i]
		srcURI := "gs://" + sa.Bucket + "/" + sa.Name
		src := h.Storage.Bucket(sa.Bucket).Object(sa.Name).Generation(sa.Generation)
		md := st.metadata(eventID)
		md[MetaSource], md[MetaSourceGeneration] = srcURI, strconv.FormatInt(sa.Generation, 10)
		obj := dst.Object(folder + name)
		p, err := place(ctx, obj, st, func(ctx context.Context, cond storage.Conditions) (*storage.ObjectAttrs, error) {
			return copyObject(ctx, obj.If(cond), src, sa.ContentType, md)
		})
		if err != nil {
			return Result{}, fmt.Errorf("copy %s to %s: %w", srcURI, h.uri(obj.ObjectName()), err)
		}
		if p.outcome == Superseded {
			return Result{Outcome: Superseded, Current: p.current.runID}, nil
		}
		m.Files = append(m.Files, h.file(name, p.attrs))
	}

	body, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Result{}, Permanent(fmt.Errorf("encode manifest: %w", err))
	}
	md := st.metadata(eventID)
	md[MetaSource] = ck.URI
	p, err := place(ctx, manifest, st, func(ctx context.Context, cond storage.Conditions) (*storage.ObjectAttrs, error) {
		return writeObject(ctx, manifest.If(cond), body, md)
	})
	if err != nil {
		return Result{}, fmt.Errorf("write %s: %w", h.uri(manifest.ObjectName()), err)
	}
	switch p.outcome {
	case Superseded:
		return Result{Outcome: Superseded, Current: p.current.runID}, nil
	case Duplicate:
		// Another delivery of the same event wrote the manifest first.
		return Result{Outcome: Duplicate, Current: st.runID}, nil
	}
	return Result{Outcome: Promoted, Current: st.runID, Manifest: &m}, nil
}

func newManifest(run events.Run, ck *checkpoints.Checkpoint, eventID string) Manifest {
	m := Manifest{
		RunID: run.RunID, Name: run.Name, EventID: eventID, EndedAt: run.EndedAt.UTC(), Source: run.Source,
		Checkpoint: ck.Name, CheckpointURI: ck.URI, Selected: "latestCheckpoint",
		Step: ck.Step, Epoch: ck.Epoch, Metrics: ck.Metrics, FinalMetrics: run.FinalMetrics,
		Files: []File{},
	}
	if ck == run.BestCheckpoint {
		m.Selected, m.BestBy = "bestCheckpoint", run.BestBy
	}
	if m.Metrics == nil {
		m.Metrics = map[string]float64{}
	}
	return m
}

// file describes a promoted file from its object's attributes, so a file an
// earlier delivery copied is described as it stands.
func (h *Handler) file(name string, a *storage.ObjectAttrs) File {
	gen, _ := strconv.ParseInt(a.Metadata[MetaSourceGeneration], 10, 64)
	return File{
		Name: name, URI: h.uri(a.Name), Generation: a.Generation, Size: a.Size,
		SourceURI: a.Metadata[MetaSource], SourceGeneration: gen,
	}
}

// folder is the object name prefix of a run name's promotions.
func (h *Handler) folder(name string) string {
	return path.Join(h.Prefix, name, "latest") + "/"
}

func (h *Handler) folderURI(name string) string { return h.uri(h.folder(name)) }

func (h *Handler) uri(name string) string { return "gs://" + h.Bucket + "/" + name }

// stamp is a run's place in the order of promotions.
type stamp struct {
	runID   string
	endedAt time.Time
}

// stampOf reads the stamp of an object; one written by anything but a
// promotion has the zero stamp, older than every run.
func stampOf(md map[string]string) stamp {
	t, err := time.Parse(time.RFC3339Nano, md[MetaEndedAt])
	if err != nil || md[MetaRunID] == "" {
		return stamp{}
	}
	return stamp{runID: md[MetaRunID], endedAt: t}
}

func (s stamp) same(o stamp) bool { return s.runID == o.runID && s.endedAt.Equal(o.endedAt) }

// after reports whether s comes after o: it ended later, or at the same
// instant with a greater run ID, so that any two runs have one order.
func (s stamp) after(o stamp) bool {
	if !s.endedAt.Equal(o.endedAt) {
		return s.endedAt.After(o.endedAt)
	}
	return s.runID > o.runID
}

func (s stamp) metadata(eventID string) map[string]string {
	return map[string]string{
		MetaRunID:   s.runID,
		MetaEndedAt: s.endedAt.UTC().Format(time.RFC3339Nano),
		MetaEventID: eventID,
	}
}

// placed is what place did with one object.
type placed struct {
	outcome Outcome              // Promoted (written), Duplicate (already this run's) or Superseded
	attrs   *storage.ObjectAttrs // the object as it stands, when it is this run's
	current stamp                // the newer run's stamp (Superseded)
}

// place writes obj with write unless it already holds run st or a newer
// run. write must send cond as the write's precondition; when Cloud Storage
// refuses it (412: someone wrote obj since it was read), place reads obj
// again and decides again.
func place(ctx context.Context, obj *storage.ObjectHandle, st stamp, write func(context.Context, storage.Conditions) (*storage.ObjectAttrs, error)) (placed, error) {
	for range tries {
		a, err := attrsOf(ctx, obj)
		if err != nil {
			return placed{}, err
		}
		cond := storage.Conditions{DoesNotExist: true}
		if a != nil {
			switch cur := stampOf(a.Metadata); {
			case cur.same(st):
				return placed{outcome: Duplicate, attrs: a}, nil
			case cur.after(st):
				return placed{outcome: Superseded, current: cur}, nil
			}
			cond = storage.Conditions{GenerationMatch: a.Generation}
		}
		a, err = write(ctx, cond)
		if isPrecondition(err) {
			continue
		}
		if err != nil {
			return placed{}, err
		}
		return placed{outcome: Promoted, attrs: a}, nil
	}
	return placed{}, fmt.Errorf("%s kept changing: %d writes lost the race", obj.ObjectName(), tries)
}

// attrsOf returns an object's attributes, nil for an object that does not
// exist.
func attrsOf(ctx context.Context, obj *storage.ObjectHandle) (*storage.ObjectAttrs, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	a, err := obj.Attrs(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil, nil
	}
	return a, err
}

// copyObject copies src to dst (which carries the precondition) on the
// server, with the destination's content type, cache control and metadata.
// Setting the metadata on the copy replaces the source's, so the stamp is
// written in the same request as the content.
func copyObject(ctx context.Context, dst, src *storage.ObjectHandle, contentType string, md map[string]string) (*storage.ObjectAttrs, error) {
	ctx, cancel := context.WithTimeout(ctx, copyTimeout)
	defer cancel()
	c := dst.CopierFrom(src)
	c.ContentType = contentType
	c.CacheControl = cacheControl
	c.Metadata = md
	return c.Run(ctx)
}

// writeObject writes body to obj (which carries the precondition) in a
// single request, which carries the precondition with the content.
func writeObject(ctx context.Context, obj *storage.ObjectHandle, body []byte, md map[string]string) (*storage.ObjectAttrs, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	w := obj.NewWriter(ctx)
	w.ContentType = "application/json"
	w.CacheControl = cacheControl
	w.Metadata = md
	w.ChunkSize = 0
	if _, err := w.Write(body); err != nil {
		_ = w.Close() // the write's error is the one to report
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return w.Attrs(), nil
}

// isPrecondition reports whether err is Cloud Storage's 412: a request
// precondition was not met.
func isPrecondition(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed
}

// sourceError marks what no redelivery changes about reading a checkpoint:
// a request Cloud Storage calls malformed (400), or a checkpoint the
// function's identity may not read (401, 403), which an event naming a
// bucket outside the subscriber's grant meets every time. Errors from the
// destination (and from a copy, once the source could be read) stay
// transient even then: the destination is the subscriber's own bucket, and
// a grant fixed after deployment should let the redelivered events through.
func sourceError(err error) error {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		switch ge.Code {
		case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden:
			return Permanent(err)
		}
	}
	return err
}
