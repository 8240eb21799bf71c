package kubesim

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// dirSource serves a folder as the stand-in's Cloud Storage: object
// "bucket/name" is the file <root>/bucket/name.
type dirSource struct{ root string }

func (d dirSource) list(_ context.Context, prefix string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(d.root, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(d.root, p)
		if name := filepath.ToSlash(rel); strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
		return nil
	})
	return out, err
}

func (d dirSource) read(_ context.Context, name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(d.root, filepath.FromSlash(name)))
}

func pngOf(t *testing.T, w, h int, c color.RGBA) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, c)
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkData writes the datasets both checks read, under root/data/.
func checkData(t *testing.T, root string) {
	t.Helper()
	colours := []color.RGBA{{220, 40, 40, 255}, {40, 40, 220, 255}, {40, 200, 40, 255}}
	names := []string{"red", "blue", "green"}
	var meta, metaBad strings.Builder
	for i := range 24 {
		name := fmt.Sprintf("images/%02d.png", i)
		write(t, filepath.Join(root, "data/shapes", name), pngOf(t, 30+i, 20+i%5, colours[i%3]))
		question := "What colour is the square?  "
		if i%7 == 0 {
			question += strings.Repeat("Think about it. ", 12) // a row over maxSeqLength
		}
		answer := any(" " + names[i%3] + ".")
		switch i {
		case 3:
			answer = "   " // blank: left out, nothing to learn
		case 10:
			answer = nil
		}
		rec, _ := json.Marshal(map[string]any{"file_name": name, "question": question, "answer": answer, "id": i})
		meta.Write(append(rec, '\n'))
		if i < 6 {
			metaBad.Write(append(rec, '\n'))
		}
	}
	write(t, filepath.Join(root, "data/shapes/metadata.jsonl"), []byte(meta.String()))
	write(t, filepath.Join(root, "data/bad/metadata.jsonl"), []byte(metaBad.String()))
	for i := range 6 {
		img := pngOf(t, 10, 10, colours[0])
		if i == 4 {
			img = []byte("\x89PNG\r\n\x1a\n but not really")
		}
		write(t, filepath.Join(root, fmt.Sprintf("data/bad/images/%02d.png", i)), img)
	}
	var conv strings.Builder
	for i := range 9 {
		k := i % 3
		var images []string
		content := []any{}
		for j := range k {
			images = append(images, "data:image/png;base64,"+base64.StdEncoding.EncodeToString(pngOf(t, 12, 8+j, colours[j])))
			content = append(content, map[string]any{"type": "image"})
		}
		content = append(content, map[string]any{"type": "text", "text": fmt.Sprintf("  How many squares? (%d)", i)})
		msgs := []any{map[string]any{"role": "user", "content": content}, map[string]any{"role": "assistant", "content": fmt.Sprintf("%d.", k)}}
		if k > 0 {
			msgs = append(msgs, map[string]any{"role": "user", "content": "And the first colour — café?"}, map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": names[0] + ". "}}})
		}
		rec, _ := json.Marshal(map[string]any{"messages": msgs, "images": images})
		conv.Write(append(rec, '\n'))
	}
	write(t, filepath.Join(root, "data/conv/train.jsonl"), []byte(conv.String()))
}

// TestStandInMatchesTheRealCheck runs trainer/datacheck.py (with the tiny
// Gemma 3 the trainer's tests build) and the local cloud's stand-in on the
// same data, and compares their verdicts and figures.
func TestStandInMatchesTheRealCheck(t *testing.T) {
	python := os.Getenv("RAYDROP_TRAINER_PYTHON")
	if python == "" {
		t.Fatal("RAYDROP_TRAINER_PYTHON is not set: run the tests through make (make test), which builds the trainer's virtualenv")
	}
	trainerDir, err := filepath.Abs("../../../trainer")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	checkData(t, root)
	env := append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "HF_DATASETS_OFFLINE=1", "TOKENIZERS_PARALLELISM=false", "PYTHONDONTWRITEBYTECODE=1")
	tiny := exec.Command(python, filepath.Join(trainerDir, "tests", "tiny.py"), filepath.Join(root, "assets"))
	tiny.Env = env
	if out, err := tiny.CombinedOutput(); err != nil {
		t.Fatalf("build the tiny model: %v\n%s", err, out)
	}
	template := `{"format": "template", "template": {"system": "You answer in one word. ", "prompt": "{question} (row {id})", "answer": "answer", "images": ["image"], "imagePlacement": "beforePrompt"}}`
	for _, c := range []struct {
		name, data, format string
		wantOK             bool
	}{
		{"imagefolder", "shapes", template, true},
		{"messages", "conv", `{"format": "messages"}`, true},
		{"undecodable image", "bad", template, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := map[string]string{"dataset-split": "train", "num-workers": "2", "per-device-batch-size": "2", "gradient-accumulation-steps": "1",
				"epochs": "3", "max-seq-length": "200", "max-dropped-share": "0.3", "eval-share": "0.25", "gpu-hour-usd": "10", "model-id": filepath.Join(root, "assets", "model")}
			argv := []string{filepath.Join(trainerDir, "datacheck.py"), "--storage-path", filepath.Join(root, "run-"+c.data), "--dataset-id", filepath.Join(root, "data", c.data),
				"--dataset-format", c.format, "--check-processes", "1"}
			for k, v := range args {
				argv = append(argv, "--"+k, v)
			}
			real := exec.Command(python, argv...)
			real.Env = env
			out, err := real.CombinedOutput()
			if c.wantOK != (err == nil) {
				t.Fatalf("datacheck.py: %v\n%s", err, out)
			}
			b, err := os.ReadFile(filepath.Join(root, "run-"+c.data, "data-check.json"))
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			var want map[string]any
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatal(err)
			}
			var f datasetFormat
			if f, err = parseFormat(c.format); err != nil {
				t.Fatal(err)
			}
			args["dataset-id"] = "gs://data/" + c.data
			got, err := standInCheck(context.Background(), dirSource{root}, args, f)
			if got == nil {
				got = checkVerdict(err, args)
			}
			if got == nil {
				t.Fatalf("stand-in: %v", err)
			}
			var gotJSON map[string]any
			_ = json.Unmarshal(mustJSON(got), &gotJSON)
			if gotJSON["ok"] != want["ok"] || gotJSON["reason"] != want["reason"] {
				t.Fatalf("verdict: stand-in %v %v, real %v %v (%v / %v)", gotJSON["ok"], gotJSON["reason"], want["ok"], want["reason"], gotJSON["message"], want["message"])
			}
			if !c.wantOK {
				// The same finding; the real check names local paths, the stand-in gs:// ones.
				for _, part := range []string{"metadata.jsonl line 5 column 'image': image ", "images/04.png does not decode"} {
					if !strings.Contains(want["message"].(string), part) || !strings.Contains(gotJSON["message"].(string), part) {
						t.Errorf("messages lack %q:\nreal:     %s\nstand-in: %s", part, want["message"], gotJSON["message"])
					}
				}
				return
			}
			for _, k := range []string{"rows", "leftOut", "leftOutRows", "tokens", "images", "steps"} {
				w, _ := json.Marshal(want[k])
				g, _ := json.Marshal(gotJSON[k])
				if !bytes.Equal(w, g) {
					t.Errorf("%s: stand-in %s, real %s", k, g, w)
				}
			}
			we, ge := want["estimate"].(map[string]any), gotJSON["estimate"].(map[string]any)
			for _, k := range []string{"seconds", "gpuHours", "usd"} {
				if d := we[k].(float64) - ge[k].(float64); d > 0.11 || d < -0.11 {
					t.Errorf("estimate %s: stand-in %v, real %v", k, ge[k], we[k])
				}
			}
			t.Logf("real and stand-in agree: rows %v, tokens %v, left out %v", want["rows"], want["tokens"], want["leftOut"])
		})
	}
}
