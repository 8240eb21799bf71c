package report

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// File is the report's name in the run's folder of the checkpoint bucket,
// beside the attempts' experiment folders.
const File = "report.html"

// ContentType is the report's Cloud Storage content type, so that a
// browser opening its authenticated URL renders it.
const ContentType = "text/html; charset=utf-8"

// Limits on what the report embeds: the sample answers' JSON and each of
// their images (inlined as data: URLs, so the page needs nothing else).
const (
	maxSamplesJSON = 4 << 20
	maxImage       = 2 << 20
	maxSamples     = 32
	// maxImagesPerSample bounds the inlined images, on average, per sample row.
	maxImagesPerSample = 2
)

// Object is where the run's report lives: its bucket and object name.
// A run whose spec was rejected has none ("" bucket).
func Object(rec *runs.Record) (bucket, name string) {
	if rec.Spec == nil {
		return "", ""
	}
	p := strings.TrimPrefix(manifests.StoragePath(rec.Spec, rec.RunID), "gs://")
	bucket, prefix, _ := strings.Cut(p, "/")
	return bucket, prefix + "/" + File
}

// URI is the report's gs:// address ("" for a run that has none).
func URI(rec *runs.Record) string {
	b, n := Object(rec)
	if b == "" {
		return ""
	}
	return "gs://" + b + "/" + n
}

// Build reads what the run's attempts left in their buckets and renders
// the report of rec as it stands: the terminal record for a run that has
// ended, the current one for a run still going. An object that cannot be
// read (gcp.Unreadable) is named in the report instead; any other
// error is returned, for the caller to retry.
func Build(ctx context.Context, bucket func(string) checkpoints.Store, rec *runs.Record, cfg config.Config, now time.Time) ([]byte, error) {
	in := Input{Record: rec, Event: events.Data(rec, rec.Phase, cfg.GPUHourUSD), GPUHourUSD: cfg.GPUHourUSD, Generated: now}
	if rec.Spec != nil {
		d := spec.Defaults()
		in.Defaults = &d
	}
	for n := 1; n <= rec.Attempt && rec.Spec != nil; n++ {
		b, exp := manifests.Experiment(rec.Spec, rec.RunID, n)
		st := bucket(b)
		lines, err := checkpoints.Series(ctx, st, exp)
		if err := in.note(err); err != nil {
			return nil, err
		}
		in.Series = append(in.Series, Attempt{N: n, Lines: lines})
		if n == rec.Attempt && rec.Result != nil && rec.Result.Mark != nil && rec.Result.Mark.Samples != nil {
			s, err := readSamples(ctx, st, exp+"/"+checkpoints.SamplesDir)
			if err := in.note(err); err != nil {
				return nil, err
			}
			in.Samples = s
		}
	}
	if rec.Evidence != "" && rec.Attempt > 0 {
		if err := in.note(in.readEvidence(ctx, bucket, rec)); err != nil {
			return nil, err
		}
	}
	return Render(in)
}

// readEvidence reads the manifest of the last attempt's evidence.
func (in *Input) readEvidence(ctx context.Context, bucket func(string) checkpoints.Store, rec *runs.Record) error {
	b, folder, err := evidence.Locate(rec.Evidence, rec.Attempt)
	if err != nil {
		return fmt.Errorf("run %s: %w: %w", rec.RunID, checkpoints.ErrUnreadable, err)
	}
	st := bucket(b)
	name := folder + "/" + evidence.ManifestFile
	doc, err := st.Read(ctx, name, 4<<20)
	if err != nil {
		return err
	}
	ev := &Evidence{Folder: st.URI(folder)}
	if err := json.Unmarshal(doc, &ev.Manifest); err != nil {
		return fmt.Errorf("parse %s: %w: %w", st.URI(name), checkpoints.ErrUnreadable, err)
	}
	in.Evidence = ev
	// The Ray pods' own logs, copied by their sidecars while they lived.
	ray := folder + "/" + evidence.RayFolder + "/"
	names, err := st.List(ctx, ray)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, n := range names {
		pod, file, ok := strings.Cut(strings.TrimPrefix(n, ray), "/")
		if !ok || file == "" {
			continue
		}
		if k := len(ev.RayLogs); k == 0 || ev.RayLogs[k-1].Pod != pod {
			ev.RayLogs = append(ev.RayLogs, RayLogs{Pod: pod, Folder: st.URI(ray + pod)})
		}
		l := &ev.RayLogs[len(ev.RayLogs)-1]
		l.Files = append(l.Files, file)
	}
	return nil
}

// note records an unreadable object in the report and returns any other
// error.
func (in *Input) note(err error) error {
	switch {
	case err == nil || errors.Is(err, checkpoints.ErrNotFound):
		return nil
	case gcp.Unreadable(err):
		in.Unreadable = append(in.Unreadable, err.Error())
		return nil
	}
	return err
}

// samplesFile is samples.json as trainer/samples.py writes it: schema 2
// names a list of images per row and scores the answers; schema 1 (runs
// trained before the dataset formats) named one image and the tutorial's
// product name and category.
type samplesFile struct {
	Count        int     `json:"count"`
	MaxNewTokens int     `json:"maxNewTokens"`
	Seconds      float64 `json:"seconds"`
	Scores       *struct {
		Base  Score `json:"base"`
		Tuned Score `json:"tuned"`
	} `json:"scores"`
	Samples []struct {
		Prompt    string   `json:"prompt"`
		Image     string   `json:"image"`
		Images    []string `json:"images"`
		Reference string   `json:"reference"`
		Base      string   `json:"base"`
		Tuned     string   `json:"tuned"`
	} `json:"samples"`
}

// readSamples reads the sample answers in dir and inlines their images.
func readSamples(ctx context.Context, st checkpoints.Store, dir string) (*Samples, error) {
	name := dir + "/" + checkpoints.SamplesFile
	b, err := st.Read(ctx, name, maxSamplesJSON)
	if err != nil {
		return nil, err
	}
	var f samplesFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("parse %s: %w: %w", st.URI(name), checkpoints.ErrUnreadable, err)
	}
	out := &Samples{URI: st.URI(name), MaxNewTokens: f.MaxNewTokens, Seconds: f.Seconds}
	if f.Scores != nil {
		out.Base, out.Tuned = &f.Scores.Base, &f.Scores.Tuned
	}
	inlined := 0
	for i, s := range f.Samples {
		if i == maxSamples {
			out.Left = len(f.Samples) - maxSamples
			break
		}
		one := Sample{Prompt: s.Prompt, Reference: s.Reference, Base: s.Base, Tuned: s.Tuned}
		names := s.Images
		if s.Image != "" {
			names = append([]string{s.Image}, names...)
		}
		for _, n := range names {
			img := SampleImage{Name: n, URI: st.URI(dir + "/" + path.Base(n))}
			if inlined == maxSamples*maxImagesPerSample {
				img.Note = "not inlined: the report inlines at most " + fmt.Sprint(maxSamples*maxImagesPerSample) + " images"
				one.Images = append(one.Images, img)
				continue
			}
			data, err := st.Read(ctx, dir+"/"+path.Base(n), maxImage)
			switch {
			case err == nil:
				// Only the image types the trainer writes are inlined: a data:
				// URL of any other type is not one html/template lets through.
				if mt := imageType(n); mt != "" {
					img.Data = template.URL("data:" + mt + ";base64," + base64.StdEncoding.EncodeToString(data))
					inlined++
				}
			case errors.Is(err, checkpoints.ErrNotFound), gcp.Unreadable(err):
				img.Note = err.Error()
			default:
				return nil, err
			}
			one.Images = append(one.Images, img)
		}
		out.Samples = append(out.Samples, one)
	}
	return out, nil
}

func imageType(name string) string {
	switch strings.ToLower(path.Ext(name)) {
	case ".png":
		return "image/png"
	case ".jpg", ".jpeg":
		return "image/jpeg"
	case ".webp":
		return "image/webp"
	case ".gif":
		return "image/gif"
	}
	return ""
}
