package kubesim

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	_ "image/gif" // the decoders the stand-in reads images with
	_ "image/jpeg"
	_ "image/png"
	"math"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/storage"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"google.golang.org/api/iterator"
	"sigs.k8s.io/yaml"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/spec"
	trainercode "github.com/raydrop/raydrop/trainer"
)

// The data check's stand-in.
//
// The real check (trainer/datacheck.py) needs Python, the trainer's
// libraries and the model's processor; the local cloud runs none of them in
// `make run`. So a RayJob that runs datacheck.py is played by this Go
// stand-in: it reads the real objects in the local data bucket the way the
// trainer reads them (the ImageFolder layout or JSON Lines files, the same
// split rules), decodes every image, renders every row as the trainer's
// template does and counts its tokens as the test suite's tiny Gemma 3 does
// (trainer/tests/tiny.py: one token per character, one per special marker,
// an image block of 4 soft tokens between two blank lines and its markers),
// and writes data-check.json with the same verdicts, messages and figures.
// TestStandInMatchesTheRealCheck runs both on the same data. What it does
// not do: Parquet files, the Hub (the local cloud has none) and Gemma 3's
// real tokenizer; the job then fails without a verdict, as the real check
// does on an error it cannot attribute to the data.

const (
	checkScript = "datacheck.py"
	// tinyImageTokens is the tiny model's image block in tokens: "\n\n",
	// <start_of_image>, 4 soft tokens, <end_of_image>, "\n\n".
	tinyImageTokens = 2 + 1 + 4 + 1 + 2
	tinyImageSeq    = 4
)

// checkSource is where the stand-in reads a dataset: the local cloud's
// Cloud Storage, or a folder in a test.
type checkSource interface {
	list(ctx context.Context, prefix string) ([]string, error) // object names under prefix
	read(ctx context.Context, name string) ([]byte, error)
}

// datasetFormat is the spec's dataset format as the pipeline passes it
// (manifests.DatasetFormat), with the trainer's defaults filled in.
type datasetFormat struct {
	Format   string        `json:"format"`
	Template spec.Template `json:"template"`
	Messages spec.Messages `json:"messages"`
}

func parseFormat(raw string) (datasetFormat, error) {
	d := spec.Defaults().Dataset // the format's defaults, as the job spec fills them
	f := datasetFormat{Format: d.Format, Template: d.Template, Messages: d.Messages}
	if raw == "" {
		return f, nil
	}
	return f, json.Unmarshal([]byte(raw), &f)
}

// dataError is a verdict: the data cannot be trained on.
type dataError struct{ msg string }

func (e *dataError) Error() string { return e.msg }

func refuse(format string, args ...any) error { return &dataError{fmt.Sprintf(format, args...)} }

// checkRow is one row read from a data file: its values, and where it came
// from ("<file> line N").
type checkRow struct {
	values map[string]any
	where  string
	folder string // the data file's folder, for relative image paths
}

// standInCheck is the stand-in's data-check.json for args (the trainer's
// flags) on src; a dataError is a verdict, any other error is a failure
// without one.
func standInCheck(ctx context.Context, src checkSource, args map[string]string, f datasetFormat) (map[string]any, error) {
	start := time.Now()
	source := args["dataset-id"]
	split := cmpOr(args["dataset-split"], "train")
	if args["eval-split"] != "" {
		return nil, errors.New("the local cloud's data check stand-in reads no evalSplit")
	}
	root, ok := strings.CutPrefix(source, "gs://")
	if !ok {
		return nil, fmt.Errorf("the local cloud's data check reads gs:// sources only; %q is on the Hugging Face Hub, which the local cloud cannot reach", source)
	}
	rows, where, err := loadCheckRows(ctx, src, strings.TrimSuffix(root, "/"), split, f)
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, refuse("%s has no rows", where)
	}
	cols := formatColumns(f)
	var missing []string
	for _, c := range cols {
		if _, ok := rows[0].values[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, refuse("%s lacks column(s) %s that dataset.%s names%s", where, pyList(missing), f.Format, holesNote(f, missing))
	}
	maxLen, _ := strconv.Atoi(cmpOr(args["max-seq-length"], strconv.Itoa(trainercode.Defaults().MaxSeqLength)))
	var lengths, answers, perRow []int
	var widths, heights []int
	left := map[string][]int{}
	for i, r := range rows {
		refs, err := rowImages(r, f)
		if err != nil {
			return nil, err
		}
		n, target, answered, err := tinyTokens(r, f, len(refs))
		if err != nil {
			return nil, refuse("%s: %v", r.where, err)
		}
		for _, ref := range refs {
			b, name, err := ref.bytes(ctx, src)
			if err != nil {
				return nil, err
			}
			cfg, _, err := image.Decode(bytes.NewReader(b))
			if err != nil {
				return nil, refuse("%s column %s: image %s does not decode: %v", r.where, quoteCols(imageColumns(f)), name, err)
			}
			widths, heights = append(widths, cfg.Bounds().Dx()), append(heights, cfg.Bounds().Dy())
		}
		cause := ""
		switch {
		case target == 0 || !answered:
			cause = "noAnswer"
		case n > maxLen:
			cause = "tooLong"
		}
		if cause != "" {
			left[cause] = append(left[cause], i)
			target = 0
		}
		lengths, answers, perRow = append(lengths, n), append(answers, target), append(perRow, len(refs))
	}
	doc, err := checkFigures(args, split, lengths, answers, perRow, widths, heights, left, maxLen, start)
	if doc != nil {
		doc["dataset"].(map[string]any)["format"] = f.Format
	}
	return doc, err
}

// checkFigures is data-check.json from the rows' figures, computed as
// datacheck.run_check computes them.
func checkFigures(args map[string]string, split string, lengths, answers, perRow, widths, heights []int, left map[string][]int, maxLen int, start time.Time) (map[string]any, error) {
	flt := func(name string, def float64) float64 {
		if v, err := strconv.ParseFloat(args[name], 64); err == nil {
			return v
		}
		return def
	}
	num := func(name string, def int) int {
		if v, err := strconv.Atoi(args[name]); err == nil {
			return v
		}
		return def
	}
	rows := len(lengths)
	leftRows := map[int]bool{}
	leftOut := map[string]int{}
	leftOutRows := map[string][]int{}
	for cause, is := range left {
		leftOut[cause] = len(is)
		leftOutRows[cause] = is[:min(20, len(is))]
		for _, i := range is {
			leftRows[i] = true
		}
	}
	dropped := len(leftRows)
	if dropped == rows {
		return nil, refuse("no row of split %q can be trained on: %s", split, pyDict(leftOut))
	}
	maxShare := flt("max-dropped-share", trainercode.Defaults().MaxDroppedShare)
	if float64(dropped)/float64(rows) > maxShare {
		return nil, refuse("%d of %d rows (%.1f %%) are left out (%s), more than training.maxDroppedShare %s allows (the longest row has %d tokens against training.maxSeqLength %d): raise training.maxSeqLength or training.maxDroppedShare, or shorten the rows",
			dropped, rows, 100*float64(dropped)/float64(rows), causes(leftOut), strconv.FormatFloat(maxShare, 'g', -1, 64), slices.Max(lengths), maxLen)
	}
	var kept []int
	for i, n := range lengths {
		if !leftRows[i] {
			kept = append(kept, n)
		}
	}
	evalShare := flt("eval-share", 0.05)
	evalN := 0
	if evalShare > 0 {
		if len(kept) < 2 {
			return nil, refuse("%d row(s) left to train on: too few to hold out rows for evaluation; set dataset.evalShare to 0", len(kept))
		}
		evalN = min(max(1, int(math.RoundToEven(float64(len(kept))*evalShare))), len(kept)-1)
	}
	trainN := len(kept) - evalN
	mean := 0.0
	for _, n := range kept {
		mean += float64(n)
	}
	mean /= float64(len(kept))
	trainTokens, evalTokens := int(math.RoundToEven(mean*float64(trainN))), int(math.RoundToEven(mean*float64(evalN)))
	workers, batch, accum := max(num("num-workers", 16), 1), max(num("per-device-batch-size", 4), 1), max(num("gradient-accumulation-steps", 1), 1)
	batches := ceilDiv(ceilDiv(trainN, workers), batch)
	perEpoch := max(batches/accum+boolInt(batches%accum > 0), 1)
	total := num("max-steps", -1)
	if total <= 0 {
		total = int(math.Ceil(flt("epochs", 3) * float64(perEpoch)))
	}
	tps, price := flt("estimate-tokens-per-gpu-second", 188), flt("gpu-hour-usd", 0)
	seconds := 0.0
	if tps > 0 {
		seconds = float64(trainTokens) * float64(total) / float64(perEpoch) / (tps * float64(workers))
	}
	gpuHours := seconds * float64(workers) / 3600
	sorted := slices.Sorted(slices.Values(kept))
	counts := map[string]int{}
	for _, n := range perRow {
		counts[strconv.Itoa(n)]++
	}
	answerSum := 0
	for _, a := range answers {
		answerSum += a
	}
	elapsed := time.Since(start).Seconds()
	return map[string]any{
		"schemaVersion": 1, "ok": true, "reason": "", "message": "", "standIn": true,
		"dataset": map[string]any{"source": args["dataset-id"], "split": split, "evalSplit": args["eval-split"], "revision": args["dataset-revision"], "format": "template"},
		"model":   args["model-id"],
		"rows":    map[string]int{"total": rows, "kept": len(kept), "train": trainN, "eval": evalN, "leftOut": dropped},
		"leftOut": leftOut, "leftOutRows": leftOutRows,
		"tokens": map[string]int{"p50": percentile(sorted, 50), "p90": percentile(sorted, 90), "max": sorted[len(sorted)-1], "maxSeqLength": maxLen,
			"answer": answerSum, "train": trainTokens, "eval": evalTokens, "imageBlock": tinyImageSeq},
		"images":   map[string]any{"total": len(widths), "perRow": counts, "width": spread(widths), "height": spread(heights)},
		"steps":    map[string]int{"perEpoch": perEpoch, "total": total},
		"estimate": map[string]any{"tokensPerGpuSecond": tps, "gpus": workers, "seconds": round(seconds, 1), "gpuHours": round(gpuHours, 3), "usd": round(gpuHours*price, 2), "gpuHourUsd": price},
		"seconds":  round(elapsed, 3),
	}, nil
}

// loadCheckRows reads a split as data.load_rows does: <root>/<split>/ then
// (train only, or split-named files) <root> itself; metadata.jsonl or .csv
// (ImageFolder), else .jsonl files.
func loadCheckRows(ctx context.Context, src checkSource, root, split string, f datasetFormat) ([]checkRow, string, error) {
	candidates := []string{root + "/" + split}
	if split == "train" {
		candidates = append(candidates, root)
	}
	for _, folder := range candidates {
		names, err := src.list(ctx, folder+"/")
		if err != nil {
			return nil, "", err
		}
		direct := map[string]string{}
		var data []string
		for _, n := range names {
			base := strings.TrimPrefix(n, folder+"/")
			if strings.Contains(base, "/") {
				continue
			}
			direct[base] = n
			if strings.HasSuffix(base, ".jsonl") || strings.HasSuffix(base, ".parquet") {
				data = append(data, n)
			}
		}
		for _, meta := range []string{"metadata.jsonl", "metadata.csv"} {
			if n, ok := direct[meta]; ok {
				rows, err := imageFolderRows(ctx, src, n)
				return rows, "gs://" + n, err
			}
		}
		if folder == root {
			var named []string
			for _, n := range data {
				if strings.HasPrefix(path.Base(n), split) {
					named = append(named, n)
				}
			}
			if len(named) == 0 && split != "train" {
				data = nil
			} else if len(named) > 0 {
				data = named
			}
		}
		if len(data) > 0 {
			sort.Strings(data)
			var rows []checkRow
			for _, n := range data {
				if strings.HasSuffix(n, ".parquet") {
					return nil, "", fmt.Errorf("gs://%s: the local cloud's data check stand-in reads no Parquet", n)
				}
				b, err := src.read(ctx, n)
				if err != nil {
					return nil, "", err
				}
				recs, err := jsonLines(b, "gs://"+n)
				if err != nil {
					return nil, "", err
				}
				rows = append(rows, recs...)
			}
			return rows, "gs://" + folder, nil
		}
	}
	var tried []string
	for _, c := range candidates {
		tried = append(tried, "gs://"+c)
	}
	return nil, "", refuse("no data for split %q at %s: expected metadata.jsonl or metadata.csv beside the images (ImageFolder), or .jsonl / .parquet files", split, strings.Join(tried, " or "))
}

func imageFolderRows(ctx context.Context, src checkSource, meta string) ([]checkRow, error) {
	b, err := src.read(ctx, meta)
	if err != nil {
		return nil, err
	}
	where := "gs://" + meta
	var rows []checkRow
	if strings.HasSuffix(meta, ".csv") {
		recs, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
		if err != nil {
			return nil, refuse("%s: not CSV: %v", where, err)
		}
		for i, rec := range recs[min(1, len(recs)):] {
			values := map[string]any{}
			for j, h := range recs[0] {
				if j < len(rec) {
					values[h] = rec[j]
				}
			}
			rows = append(rows, checkRow{values: values, where: fmt.Sprintf("%s line %d", where, i+2)})
		}
	} else if rows, err = jsonLines(b, where); err != nil {
		return nil, err
	}
	for i := range rows {
		r := &rows[i]
		r.folder = path.Dir(meta)
		name, _ := r.values["file_name"].(string)
		if name == "" {
			return nil, refuse("%s: no 'file_name' (ImageFolder names each row's image there)", r.where)
		}
		delete(r.values, "file_name")
		r.values["image"] = name
	}
	return rows, nil
}

func jsonLines(b []byte, where string) ([]checkRow, error) {
	var rows []checkRow
	for i, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var values map[string]any
		if err := json.Unmarshal([]byte(line), &values); err != nil {
			return nil, refuse("%s line %d: not JSON (%v)", where, i+1, err)
		}
		rows = append(rows, checkRow{values: values, where: fmt.Sprintf("%s line %d", where, i+1), folder: path.Dir(strings.TrimPrefix(where, "gs://"))})
	}
	return rows, nil
}

// imageRef is a row's image: an object, or embedded bytes.
type imageRef struct {
	object string
	data   []byte
}

func (r imageRef) bytes(ctx context.Context, src checkSource) ([]byte, string, error) {
	if r.object == "" {
		return r.data, "embedded image", nil
	}
	b, err := src.read(ctx, r.object)
	return b, "gs://" + r.object, err
}

func rowImages(r checkRow, f datasetFormat) ([]imageRef, error) {
	var out []imageRef
	for _, col := range imageColumns(f) {
		v := r.values[col]
		items, isList := v.([]any)
		if !isList {
			if v == nil {
				continue
			}
			items = []any{v}
		}
		for _, it := range items {
			s, ok := it.(string)
			switch {
			case !ok || s == "":
				return nil, refuse("%s column %q: an image is a relative path, a gs:// URI or bytes", r.where, col)
			case strings.HasPrefix(s, "data:"):
				_, enc, _ := strings.Cut(s, ",")
				b, err := base64.StdEncoding.DecodeString(enc)
				if err != nil {
					return nil, refuse("%s column %q: a data: URI that is not base64", r.where, col)
				}
				out = append(out, imageRef{data: b})
			case strings.HasPrefix(s, "gs://"):
				out = append(out, imageRef{object: strings.TrimPrefix(s, "gs://")})
			case strings.Contains(s, "://") || strings.HasPrefix(s, "/"):
				return nil, refuse("%s column %q: image %s must be relative to the data file or a gs:// URI", r.where, col, pyQuote(s))
			default:
				joined := path.Clean(path.Join(r.folder, s))
				out = append(out, imageRef{object: joined})
			}
		}
	}
	return out, nil
}

// tinyTokens counts a row's tokens and its target tokens as the trainer
// encodes it with the tiny model's processor (trainer/tests/tiny.py): the
// chat template renders <bos>, then per turn <start_of_turn>, the role and
// a newline, the system text and a blank line before the first user turn's
// content, each text part trimmed, an image marker per image, and
// <end_of_turn> and a newline; every character is one token, every marker
// one, and an image marker expands to the image block. Targets are each
// assistant turn's text and its two closing tokens; a row is answered when
// some assistant turn has text (data.has_answer).
func tinyTokens(r checkRow, f datasetFormat, images int) (total, target int, answered bool, err error) {
	type part struct {
		image bool
		text  string
	}
	type turn struct {
		role  string
		parts []part
	}
	var turns []turn
	if f.Format == spec.FormatMessages {
		raw := r.values[f.Messages.Column]
		if s, ok := raw.(string); ok {
			if err := json.Unmarshal([]byte(s), &raw); err != nil {
				return 0, 0, false, fmt.Errorf("column %q is not a JSON list of messages", f.Messages.Column)
			}
		}
		msgs, _ := raw.([]any)
		for _, m := range msgs {
			mm, _ := m.(map[string]any)
			role, _ := mm["role"].(string)
			t := turn{role: role}
			switch c := mm["content"].(type) {
			case string:
				t.parts = []part{{text: c}}
			case []any:
				for _, p := range c {
					pm, _ := p.(map[string]any)
					if pm["type"] == "image" {
						t.parts = append(t.parts, part{image: true})
					} else {
						text, _ := pm["text"].(string)
						t.parts = append(t.parts, part{text: text})
					}
				}
			}
			turns = append(turns, t)
		}
	} else {
		vals := map[string]string{}
		for k, v := range r.values {
			vals[k] = pyStr(v)
		}
		text := part{text: renderTemplate(f.Template.Prompt, vals)}
		user := turn{role: "user"}
		imgs := make([]part, images)
		for i := range imgs {
			imgs[i].image = true
		}
		if f.Template.ImagePlacement == "beforePrompt" {
			user.parts = append(imgs, text)
		} else {
			user.parts = append([]part{text}, imgs...)
		}
		if f.Template.System != "" {
			turns = append(turns, turn{role: "system", parts: []part{{text: f.Template.System}}})
		}
		turns = append(turns, user, turn{role: "assistant", parts: []part{{text: vals[f.Template.Answer]}}})
	}
	total = 1 // <bos>
	prefix := 0
	if len(turns) > 0 && turns[0].role == "system" {
		if len(turns[0].parts) > 0 {
			prefix = utf8.RuneCountInString(turns[0].parts[0].text) + 2
		}
		turns = turns[1:]
	}
	markers := 0
	for i, t := range turns {
		role := t.role
		if role == "assistant" {
			role = "model"
		}
		n := 1 + utf8.RuneCountInString(role) + 1 + 2 // <start_of_turn>, role, "\n", <end_of_turn>, "\n"
		if i == 0 {
			n += prefix
		}
		text := 0
		for _, p := range t.parts {
			if p.image {
				n += tinyImageTokens
				markers++
				continue
			}
			c := utf8.RuneCountInString(strings.TrimSpace(p.text))
			n, text = n+c, text+c
		}
		if t.role == "assistant" {
			target += text + 2
			answered = answered || text > 0
		}
		total += n
	}
	if markers != images {
		return 0, 0, false, fmt.Errorf("%d image placeholder(s) in the conversation for %d image(s) in column(s) %s", markers, images, pyList(imageColumns(f)))
	}
	return total, target, answered, nil
}

func renderTemplate(t string, vals map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		switch {
		case strings.HasPrefix(t[i:], "{{"):
			b.WriteByte('{')
			i++
		case strings.HasPrefix(t[i:], "}}"):
			b.WriteByte('}')
			i++
		case t[i] == '{':
			end := strings.IndexByte(t[i:], '}')
			b.WriteString(vals[t[i+1:i+end]])
			i += end
		default:
			b.WriteByte(t[i])
		}
	}
	return b.String()
}

func formatColumns(f datasetFormat) []string {
	if f.Format == spec.FormatMessages {
		return []string{f.Messages.Column, f.Messages.ImagesColumn}
	}
	names, _ := spec.Placeholders(f.Template.Prompt)
	var out []string
	for _, c := range append(append(names, f.Template.Answer), f.Template.Images...) {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

func imageColumns(f datasetFormat) []string {
	if f.Format == spec.FormatMessages {
		return []string{f.Messages.ImagesColumn}
	}
	return f.Template.Images
}

func holesNote(f datasetFormat, missing []string) string {
	if f.Format != spec.FormatTemplate {
		return ""
	}
	names, _ := spec.Placeholders(f.Template.Prompt)
	var holes []string
	for _, c := range missing {
		if slices.Contains(names, c) {
			holes = append(holes, "{"+c+"}")
		}
	}
	if len(holes) == 0 {
		return ""
	}
	return " (dataset.template.prompt has placeholder(s) " + pyList(holes) + ")"
}

func causes(left map[string]int) string {
	words := map[string]string{"tooLong": "longer than training.maxSeqLength", "noAnswer": "with an empty answer"}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range left {
			if !yield(k) {
				return
			}
		}
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", left[k], cmpOr(words[k], k)))
	}
	return strings.Join(parts, ", ")
}

// pyStr is str(value) as Python prints a JSON value in a template.
func pyStr(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1e16 {
			return strconv.FormatInt(int64(x), 10)
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	case bool:
		if x {
			return "True"
		}
		return "False"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func pyQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `\'`) + "'" }

func pyList(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = pyQuote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func quoteCols(cols []string) string {
	q := make([]string, len(cols))
	for i, c := range cols {
		q[i] = pyQuote(c)
	}
	return strings.Join(q, ", ")
}

func pyDict(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", pyQuote(k), m[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func percentile(sorted []int, p float64) int {
	if len(sorted) == 0 {
		return 0
	}
	k := max(0, int(math.Ceil(p/100*float64(len(sorted))))-1)
	return sorted[k]
}

func spread(v []int) map[string]int {
	if len(v) == 0 {
		return map[string]int{"min": 0, "p50": 0, "max": 0}
	}
	s := slices.Sorted(slices.Values(v))
	return map[string]int{"min": s[0], "p50": percentile(s, 50), "max": s[len(s)-1]}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// checkVerdict is data-check.json for a refusal.
func checkVerdict(err error, args map[string]string) map[string]any {
	var de *dataError
	if !errors.As(err, &de) {
		return nil
	}
	return map[string]any{"schemaVersion": 1, "ok": false, "reason": "InvalidData", "message": de.msg, "standIn": true,
		"dataset": map[string]any{"source": args["dataset-id"], "split": cmpOr(args["dataset-split"], "train"), "evalSplit": args["eval-split"], "revision": args["dataset-revision"]},
		"model":   args["model-id"]}
}

// gcsSource reads a dataset from the local cloud's Cloud Storage.
type gcsSource struct{ st *store }

func (g gcsSource) list(ctx context.Context, prefix string) ([]string, error) {
	bucket, p, _ := strings.Cut(prefix, "/")
	it := g.st.c.Bucket(bucket).Objects(ctx, &storage.Query{Prefix: p})
	var out []string
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list gs://%s: %w", prefix, err)
		}
		out = append(out, bucket+"/"+a.Name)
	}
}

func (g gcsSource) read(ctx context.Context, name string) ([]byte, error) {
	bucket, p, _ := strings.Cut(name, "/")
	return g.st.get(ctx, bucket, p)
}

// check plays the data check's RayJob: the stand-in's verdict is written
// where datacheck.py writes it (<storage path>/data-check.json); a refusal
// fails the Ray job as the script's exit code 4 does, an error it cannot
// pin on the data fails it without a verdict.
func (p *play) check(ctx context.Context, rj *rayv1.RayJob, args *trainerArgs) {
	log := p.log()
	format, err := parseFormat(runtimeEnvVar(rj.Spec.RuntimeEnvYAML, manifests.DatasetFormatEnv))
	if err != nil {
		p.end(rayv1.JobStatusFailed, "usage error: --dataset-format: "+err.Error(), msgBadFlags)
		return
	}
	st := newStore(p.d.sim.o.Storage, p.d.sim.o.Project)
	// The check's driver stages the base model first when its run is the
	// one that stages it, as datacheck.stage_model does; it waits for no
	// other run's, and a copy that fails is left to the training driver.
	if args.all["stage-model"] == "true" {
		switch err := (&trainer{p: p, a: args, st: st}).stageModel(ctx); {
		case errors.Is(err, errStopped):
			p.end(rayv1.JobStatusStopped, "", "")
			return
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Info("could not stage the model; the training attempt stages it", "err", err)
		}
	}
	doc, err := standInCheck(ctx, gcsSource{st}, args.all, format)
	if doc == nil {
		doc = checkVerdict(err, args.all)
	}
	if doc == nil {
		log.Info("data check failed", "err", err)
		p.end(rayv1.JobStatusFailed, err.Error(), "")
		return
	}
	if werr := st.put(ctx, args.bucket, joinName(args.prefix, checkpoints.DataCheckFile), mustJSON(doc)); werr != nil {
		log.Warn("data check could not write its verdict", "err", werr)
		p.end(rayv1.JobStatusFailed, werr.Error(), "")
		return
	}
	if err != nil {
		log.Info("data check refused the data", "message", err.Error())
		p.end(rayv1.JobStatusFailed, "raydrop: data check InvalidData: "+err.Error(), "")
		return
	}
	log.Info("data check passed", "rows", doc["rows"])
	p.end(rayv1.JobStatusSucceeded, "", "")
}

// runtimeEnvVar is one env_vars entry of a RayJob's runtime env.
func runtimeEnvVar(runtimeEnvYAML, name string) string {
	var env struct {
		EnvVars map[string]string `json:"env_vars"`
	}
	if err := yaml.Unmarshal([]byte(runtimeEnvYAML), &env); err != nil {
		return ""
	}
	return env.EnvVars[name]
}
