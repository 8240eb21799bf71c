package kubesim

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"time"
)

// writeSamples writes what trainer/samples.py writes after a successful
// run: <experiment>/samples/samples.json and one PNG per held-out row
// answered (--sample-answers of them, at most the held-out rows). The
// simulated job has no model: the answers say they are simulated, and the
// images are solid colours of the toy dataset's size.
func (t *trainer) writeSamples(ctx context.Context) error {
	n := min(t.a.sampleAnswers, t.evalRows)
	if n <= 0 {
		return nil
	}
	t.heart.note("sampling")
	start := time.Now()
	dir := t.a.experimentName() + "/samples/"
	var items []map[string]any
	for i := range n {
		img := image.NewRGBA(image.Rect(0, 0, 48, 40))
		c := color.RGBA{R: uint8(40 * i), G: 120, B: 200, A: 255}
		for y := range 40 {
			for x := range 48 {
				img.Set(x, y, c)
			}
		}
		var buf bytes.Buffer
		if err := png.Encode(&buf, img); err != nil {
			return err
		}
		name := fmt.Sprintf("sample-%02d.png", i)
		if err := t.st.put(ctx, t.a.bucket, dir+name, buf.Bytes()); err != nil {
			return err
		}
		items = append(items, map[string]any{
			"prompt": fmt.Sprintf("<bos><start_of_turn>user\n(simulated prompt %d)<start_of_image><end_of_turn>\n<start_of_turn>model\n", i),
			"images": []string{name}, "reference": "A simulated reference answer.",
			"base": "A simulated answer of the base model.", "tuned": "A simulated reference answer.",
		})
	}
	seconds := round(time.Since(start).Seconds(), 3)
	// The scores trainer/samples.py computes for these answers: the tuned
	// model repeats every reference; the base model's 7 words share 3 with
	// the reference's 4 (precision 3/7, recall 3/4: F1 18/33).
	scores := map[string]any{"base": map[string]float64{"exactMatch": 0, "tokenF1": 0.5455}, "tuned": map[string]float64{"exactMatch": 1, "tokenF1": 1}}
	doc := map[string]any{"schemaVersion": 2, "count": n, "maxNewTokens": 256, "seconds": seconds, "generateSeconds": seconds, "scores": scores, "samples": items}
	if err := t.st.put(ctx, t.a.bucket, dir+"samples.json", mustJSON(doc)); err != nil {
		return err
	}
	t.samples = map[string]any{"uri": gsURI(t.a.bucket, dir+"samples.json"), "count": n, "seconds": seconds}
	return nil
}
